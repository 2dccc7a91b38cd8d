//! A string kept inline up to `N` bytes, on the heap only past that: the
//! short names a request handles many of (JSON member names, shared-data
//! keys) cost no allocation. A quarter of the flow's time inside wasm was
//! the allocator (`benches/host_calls.rs` counts allocations per request).

use std::fmt;
use std::ops::Deref;

#[derive(Clone)]
pub struct InlineStr<const N: usize> {
    inline: [u8; N],
    len: usize,
    /// Everything, once it outgrew `inline`.
    heap: Option<String>,
}

impl<const N: usize> InlineStr<N> {
    pub fn new() -> InlineStr<N> {
        InlineStr {
            inline: [0; N],
            len: 0,
            heap: None,
        }
    }

    pub fn push_str(&mut self, s: &str) {
        if let Some(heap) = &mut self.heap {
            heap.push_str(s);
            return;
        }
        let end = self.len + s.len();
        if let Some(room) = self.inline.get_mut(self.len..end) {
            room.copy_from_slice(s.as_bytes());
            self.len = end;
            return;
        }
        let mut heap = String::with_capacity(end);
        heap.push_str(self.as_str());
        heap.push_str(s);
        self.heap = Some(heap);
    }

    /// `v` as `{:016x}`.
    pub fn push_hex16(&mut self, v: u64) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [b'0'; 16];
        for (i, d) in out.iter_mut().enumerate() {
            let nibble = (v >> (60 - 4 * i)) & 0xf;
            *d = DIGITS.get(nibble as usize).copied().unwrap_or(b'0');
        }
        self.push_ascii(&out);
    }

    /// `v` in decimal, as `{}`.
    pub fn push_decimal(&mut self, v: u64) {
        let mut out = [0u8; 20];
        let mut n = v;
        let mut start = out.len();
        while start > 0 {
            start -= 1;
            if let Some(d) = out.get_mut(start) {
                *d = b'0' + (n % 10) as u8;
            }
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push_ascii(out.get(start..).unwrap_or_default());
    }

    fn push_ascii(&mut self, digits: &[u8]) {
        // Digits are ASCII: valid UTF-8 whatever the bytes.
        self.push_str(std::str::from_utf8(digits).unwrap_or_default());
    }

    /// Cheaper than [`InlineStr::as_str`] (no UTF-8 check): for comparisons.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.heap {
            Some(s) => s.as_bytes(),
            None => self.inline.get(..self.len).unwrap_or_default(),
        }
    }

    pub fn as_str(&self) -> &str {
        match &self.heap {
            Some(s) => s,
            // Only whole `&str`s are ever copied in, so the prefix is UTF-8.
            None => std::str::from_utf8(self.inline.get(..self.len).unwrap_or_default())
                .unwrap_or_default(),
        }
    }
}

impl<const N: usize> Default for InlineStr<N> {
    fn default() -> InlineStr<N> {
        InlineStr::new()
    }
}

impl<const N: usize> From<&str> for InlineStr<N> {
    fn from(s: &str) -> InlineStr<N> {
        let mut out = InlineStr::new();
        out.push_str(s);
        out
    }
}

impl<const N: usize> Deref for InlineStr<N> {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl<const N: usize> PartialEq for InlineStr<N> {
    fn eq(&self, other: &InlineStr<N>) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl<const N: usize> Eq for InlineStr<N> {}

impl<const N: usize> PartialEq<str> for InlineStr<N> {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl<const N: usize> PartialEq<&str> for InlineStr<N> {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl<const N: usize> fmt::Debug for InlineStr<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_strings_stay_inline_and_long_ones_move_whole() {
        let mut s = InlineStr::<8>::from("abc");
        assert!(s.heap.is_none());
        s.push_str("defgh");
        assert_eq!(s, "abcdefgh");
        assert!(s.heap.is_none(), "exactly full is still inline");
        s.push_str("é!");
        assert_eq!(s, "abcdefghé!");
        assert!(s.heap.is_some());
        s.push_str("more");
        assert_eq!(s.as_str(), "abcdefghé!more");
        assert_eq!(InlineStr::<4>::from("a longer one"), "a longer one");
        assert_eq!(InlineStr::<4>::new(), "");
    }

    #[test]
    fn numbers_read_as_formatted() {
        for v in [0u64, 7, 10, 468, 13_370, u32::MAX as u64, u64::MAX] {
            let mut d = InlineStr::<32>::new();
            d.push_decimal(v);
            assert_eq!(d, format!("{v}").as_str());
            let mut h = InlineStr::<32>::new();
            h.push_hex16(v);
            assert_eq!(h, format!("{v:016x}").as_str());
        }
    }
}
