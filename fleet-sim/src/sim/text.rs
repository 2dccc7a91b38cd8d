//! Prompts made from a trace's prefix-block hash ids, and the ids read back
//! from a prompt: requests that share leading ids share byte prefixes, so
//! every router sees the prefix sharing the trace recorded, and a simulated
//! pod recovers exactly which blocks a prompt holds.
//!
//! A block is [`BLOCK_TOKENS`] tokens of [`BYTES_PER_TOKEN`] bytes each (the
//! router's own estimate is bytes / 4): a marker `#<id in hex>;` and then
//! filler that is a pure function of the id (lowercase letters and spaces,
//! so it is a JSON string as it stands). The last block is cut to the
//! request's length; a cut that leaves no whole marker makes an anonymous
//! tail, which no cache can hold.

/// Tokens of one trace block (the Mooncake trace's 512).
pub const BLOCK_TOKENS: u32 = 512;
/// Bytes per token, as the router estimates them.
pub const BYTES_PER_TOKEN: usize = 4;
/// Bytes of one whole block.
pub const BLOCK_BYTES: usize = BLOCK_TOKENS as usize * BYTES_PER_TOKEN;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The whole text of block `id`.
pub fn block_text(id: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(BLOCK_BYTES);
    out.extend_from_slice(format!("#{id:x};").as_bytes());
    let mut state = id;
    while out.len() < BLOCK_BYTES {
        let r = splitmix(&mut state);
        for byte in r.to_le_bytes() {
            if out.len() == BLOCK_BYTES {
                break;
            }
            // About one space in six: word-like runs of letters.
            let c = byte % 32;
            out.push(if c < 6 { b' ' } else { b'a' + (c - 6) % 26 });
        }
    }
    out
}

/// The prompt of a request of `input_tokens` tokens whose blocks are
/// `hash_ids` (the trace has `ceil(input_tokens / 512)` of them).
pub fn prompt_text(hash_ids: &[u64], input_tokens: u32) -> String {
    let len = input_tokens as usize * BYTES_PER_TOKEN;
    let mut out = Vec::with_capacity(len);
    for id in hash_ids {
        if out.len() >= len {
            break;
        }
        let block = block_text(*id);
        let take = (len - out.len()).min(BLOCK_BYTES);
        out.extend_from_slice(block.get(..take).unwrap_or_default());
    }
    // Bytes past the trace's blocks (a trace that lists too few) repeat
    // filler without a marker: tokens, but no block to match.
    while out.len() < len {
        out.push(b' ');
    }
    String::from_utf8(out).unwrap_or_default()
}

/// One block of a parsed prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// `None`: a tail too short to carry its marker.
    pub id: Option<u64>,
    pub tokens: u32,
}

/// A prompt read back: its blocks in order and its length in tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub blocks: Vec<Block>,
    pub tokens: u32,
}

impl Prompt {
    /// The ids of the leading blocks that carry one (a cache holds only these).
    pub fn ids(&self) -> Vec<u64> {
        self.blocks.iter().map_while(|b| b.id).collect()
    }
}

/// Reads the blocks of a prompt made by [`prompt_text`]. Text that is not
/// one (a marker missing where a block starts) is still a prompt of its
/// length, with no block to match from that point on.
pub fn parse_prompt(text: &[u8]) -> Prompt {
    let tokens = text.len().div_ceil(BYTES_PER_TOKEN) as u32;
    let mut blocks = Vec::with_capacity(text.len() / BLOCK_BYTES + 1);
    for chunk in text.chunks(BLOCK_BYTES) {
        let id = chunk
            .strip_prefix(b"#")
            .and_then(|rest| {
                let end = rest.iter().position(|b| *b == b';')?;
                let hex = std::str::from_utf8(rest.get(..end)?).ok()?;
                u64::from_str_radix(hex, 16).ok()
            })
            .filter(|id| block_text(*id).starts_with(chunk));
        blocks.push(Block {
            id,
            tokens: chunk.len().div_ceil(BYTES_PER_TOKEN) as u32,
        });
    }
    Prompt { blocks, tokens }
}

/// Token ids for a prompt, as an engine's tokenizer would hand them to a
/// router that asks (vllm-router's `/v1/completions/render`): one id per
/// token, equal for equal blocks.
pub fn token_ids(prompt: &Prompt) -> Vec<u32> {
    let mut out = Vec::with_capacity(prompt.tokens as usize);
    for (i, b) in prompt.blocks.iter().enumerate() {
        // Named blocks' ids stay below ANONYMOUS_BASE for ids under 2^21
        // (a trace's are far fewer), so they read back.
        let base = b.id.map_or(ANONYMOUS_BASE + i as u64, |id| {
            id.wrapping_mul(BLOCK_TOKENS as u64)
        });
        for t in 0..b.tokens {
            out.push((base.wrapping_add(t as u64) % 0x7FFF_FFFF) as u32);
        }
    }
    out
}

/// The base of an anonymous block's token ids (block `i` starts at
/// `ANONYMOUS_BASE + i`): above every named block's ids, so no anonymous
/// block reads back as a named one.
const ANONYMOUS_BASE: u64 = 0x4000_0000;

/// A prompt sent as the token ids [`token_ids`] gives (a router that keys on
/// token ids needs no tokenizer call): its blocks and length, as
/// [`parse_prompt`] reads the same prompt's text. A chunk of
/// [`BLOCK_TOKENS`] ids that is not a named block's is anonymous.
pub fn parse_token_ids(ids: &[u32]) -> Prompt {
    let blocks = ids
        .chunks(BLOCK_TOKENS as usize)
        .map(|chunk| {
            let first = chunk.first().copied().unwrap_or(0) as u64;
            let named = first < ANONYMOUS_BASE
                && first.is_multiple_of(BLOCK_TOKENS as u64)
                && chunk
                    .iter()
                    .enumerate()
                    .all(|(t, id)| *id as u64 == first + t as u64);
            Block {
                id: named.then_some(first / BLOCK_TOKENS as u64),
                tokens: chunk.len() as u32,
            }
        })
        .collect();
    Prompt {
        blocks,
        tokens: ids.len() as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_the_text() {
        let ids = [0u64, 7, 0x1234_5678, 42];
        for tokens in [1u32, 5, 511, 512, 513, 1500, 2048] {
            let n = tokens.div_ceil(BLOCK_TOKENS) as usize;
            let text = prompt_text(&ids[..n.min(ids.len())], tokens);
            assert_eq!(text.len(), tokens as usize * BYTES_PER_TOKEN);
            let p = parse_prompt(text.as_bytes());
            assert_eq!(p.tokens, tokens);
            assert_eq!(p.blocks.len(), n);
            let sum: u32 = p.blocks.iter().map(|b| b.tokens).sum();
            assert_eq!(sum, tokens);
            for (b, id) in p.blocks.iter().zip(ids) {
                // A tail shorter than its marker is anonymous.
                let whole_marker = format!("#{id:x};").len() as u32 <= b.tokens * 4;
                assert_eq!(b.id, whole_marker.then_some(id), "{tokens} tokens");
            }
        }
    }

    #[test]
    fn shared_leading_ids_share_bytes_and_others_do_not() {
        let a = prompt_text(&[0, 1, 2], 1536);
        let b = prompt_text(&[0, 1, 9], 1536);
        let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        assert!(
            (2 * BLOCK_BYTES..2 * BLOCK_BYTES + 8).contains(&common),
            "{common}"
        );
        assert!(a
            .bytes()
            .all(|c| c == b' ' || c == b'#' || c == b';' || c.is_ascii_alphanumeric()));
    }

    #[test]
    fn foreign_text_has_no_blocks_to_match() {
        let p = parse_prompt(b"hello world, not a trace prompt");
        assert_eq!(p.ids(), Vec::<u64>::new());
        assert_eq!(p.tokens, 8);
        let forged = format!("#5;{}", "x".repeat(100));
        assert_eq!(parse_prompt(forged.as_bytes()).ids(), Vec::<u64>::new());
    }

    #[test]
    fn token_ids_read_back_as_the_text_does() {
        for (ids, tokens) in [
            (&[3u64, 4][..], 600u32),
            (&[0, 7, 9], 1100),
            (&[5], 1),
            (&[], 0),
        ] {
            let p = parse_prompt(prompt_text(ids, tokens).as_bytes());
            assert_eq!(parse_token_ids(&token_ids(&p)), p, "{ids:?} {tokens}");
        }
        let foreign = parse_token_ids(&[1, 2, 3]);
        assert_eq!((foreign.ids(), foreign.tokens), (vec![], 3));
    }

    #[test]
    fn token_ids_follow_blocks() {
        let p = parse_prompt(prompt_text(&[3, 4], 600).as_bytes());
        let t = token_ids(&p);
        assert_eq!(t.len(), 600);
        let q = parse_prompt(prompt_text(&[3, 5], 600).as_bytes());
        let u = token_ids(&q);
        assert_eq!(t[..512], u[..512]);
        assert_ne!(t[512..], u[512..]);
    }
}
