//! The one binary record format of Envoy shared data: fixed-layout
//! little-endian fields, written and read in order. Every table the worker
//! VMs share (pod load, scraped metrics, prefix entries, the scrape lease, the
//! worker-slot counter) is a sequence of such records, so a truncated or
//! foreign value reads as "absent" instead of garbage or a panic.

/// Writes one record's fields in order.
#[derive(Debug, Default)]
pub struct RecordWriter {
    bytes: Vec<u8>,
}

impl RecordWriter {
    pub fn with_capacity(n: usize) -> RecordWriter {
        RecordWriter {
            bytes: Vec::with_capacity(n),
        }
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// An optional value as `f32`, NaN standing for "absent".
    pub fn f32(&mut self, v: Option<f64>) -> &mut Self {
        let v = v.map(|v| v as f32).unwrap_or(f32::NAN);
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

/// Reads one record's fields in the order they were written; each read is
/// `None` once the record runs out.
#[derive(Debug, Clone)]
pub struct RecordReader<'a> {
    rest: &'a [u8],
}

impl<'a> RecordReader<'a> {
    pub fn new(bytes: &'a [u8]) -> RecordReader<'a> {
        RecordReader { rest: bytes }
    }

    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.rest.split_first_chunk::<N>()?;
        self.rest = rest;
        Some(*head)
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    pub fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    /// An optional value written by [`RecordWriter::f32`]; a non-finite
    /// value reads as absent.
    pub fn f32(&mut self) -> Option<Option<f64>> {
        let v = f32::from_le_bytes(self.take()?);
        Some(v.is_finite().then_some(v as f64))
    }
}

/// The records of a table of `size`-byte records; a trailing partial record
/// (a value written by another layout) is ignored.
pub fn records(bytes: &[u8], size: usize) -> impl Iterator<Item = RecordReader<'_>> {
    bytes.chunks_exact(size.max(1)).map(RecordReader::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_in_order() {
        let mut w = RecordWriter::default();
        w.u64(u64::MAX).u32(7).f32(Some(0.5)).f32(None);
        let bytes = w.finish();
        assert_eq!(bytes.len(), 20);
        let mut r = RecordReader::new(&bytes);
        assert_eq!(r.u64(), Some(u64::MAX));
        assert_eq!(r.u32(), Some(7));
        assert_eq!(r.f32(), Some(Some(0.5)));
        assert_eq!(r.f32(), Some(None));
        assert_eq!(r.u32(), None, "past the end");
    }

    #[test]
    fn tables_ignore_a_trailing_partial_record() {
        let bytes = [1u8, 0, 0, 0, 2, 0, 0, 0, 9];
        let got: Vec<Option<u32>> = records(&bytes, 4).map(|mut r| r.u32()).collect();
        assert_eq!(got, vec![Some(1), Some(2)]);
        assert_eq!(records(&[], 4).count(), 0);
    }
}
