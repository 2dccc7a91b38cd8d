//! Prompts made from a trace's prefix-block hash ids, and the ids read back
//! from a prompt: requests that share leading ids share byte prefixes, so
//! every router sees the prefix sharing the trace recorded, and a simulated
//! pod recovers exactly which blocks a prompt holds.
//!
//! A block is [`BLOCK_TOKENS`] tokens of [`Shape::bytes_per_token`] bytes
//! each (4 by default, pd-router's own estimate; Llama-3's tokenizer gives
//! English prose about 3.6): a marker `#<id in hex>;` and then filler that is
//! a pure function of the id and [`Shape::seed`] (lowercase letters and
//! spaces, so it is a JSON string as it stands). The last block is cut to
//! the request's length; a cut that leaves no whole marker makes an
//! anonymous tail, which no cache can hold. The replayer and the pods must
//! agree on the shape.

/// Tokens of one trace block (the Mooncake trace's 512).
pub const BLOCK_TOKENS: u32 = 512;

/// How prompt text is made from block ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Bytes of text per token (at least 1).
    pub bytes_per_token: usize,
    /// Varies every block's filler (0: the filler of earlier runs).
    pub seed: u64,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape {
            bytes_per_token: 4,
            seed: 0,
        }
    }
}

impl Shape {
    /// Bytes of one whole block.
    pub fn block_bytes(&self) -> usize {
        BLOCK_TOKENS as usize * self.bytes_per_token.max(1)
    }

    fn bpt(&self) -> usize {
        self.bytes_per_token.max(1)
    }
}

/// SplitMix64: the next of a seeded sequence of well-mixed numbers.
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The whole text of block `id`.
pub fn block_text(id: u64, shape: Shape) -> Vec<u8> {
    let len = shape.block_bytes();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(format!("#{id:x};").as_bytes());
    let mut state = id ^ shape.seed.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    while out.len() < len {
        let r = splitmix(&mut state);
        for byte in r.to_le_bytes() {
            if out.len() == len {
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
pub fn prompt_text(hash_ids: &[u64], input_tokens: u32, shape: Shape) -> String {
    let len = input_tokens as usize * shape.bpt();
    let mut out = Vec::with_capacity(len);
    for id in hash_ids {
        if out.len() >= len {
            break;
        }
        let block = block_text(*id, shape);
        let take = (len - out.len()).min(shape.block_bytes());
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
pub fn parse_prompt(text: &[u8], shape: Shape) -> Prompt {
    let bpt = shape.bpt();
    let tokens = text.len().div_ceil(bpt) as u32;
    let mut blocks = Vec::with_capacity(text.len() / shape.block_bytes() + 1);
    for chunk in text.chunks(shape.block_bytes()) {
        let id = chunk
            .strip_prefix(b"#")
            .and_then(|rest| {
                let end = rest.iter().position(|b| *b == b';')?;
                let hex = std::str::from_utf8(rest.get(..end)?).ok()?;
                u64::from_str_radix(hex, 16).ok()
            })
            .filter(|id| block_text(*id, shape).starts_with(chunk));
        blocks.push(Block {
            id,
            tokens: chunk.len().div_ceil(bpt) as u32,
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
            let text = prompt_text(&ids[..n.min(ids.len())], tokens, Shape::default());
            assert_eq!(text.len(), tokens as usize * 4);
            let p = parse_prompt(text.as_bytes(), Shape::default());
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
    fn bytes_per_token_sets_the_texts_length_and_the_tokens_read_back() {
        for bpt in [3, 5] {
            let shape = Shape {
                bytes_per_token: bpt,
                seed: 0,
            };
            let text = prompt_text(&[4, 5, 6], 1300, shape);
            assert_eq!(text.len(), 1300 * bpt);
            let p = parse_prompt(text.as_bytes(), shape);
            assert_eq!((p.tokens, p.ids()), (1300, vec![4, 5, 6]));
            let tokens: Vec<u32> = p.blocks.iter().map(|b| b.tokens).collect();
            assert_eq!(tokens, vec![512, 512, 276]);
            // Read at 4 bytes a token (a router's estimate), it is longer or
            // shorter than it is.
            let four = parse_prompt(text.as_bytes(), Shape::default());
            assert_eq!(four.tokens as usize, (1300 * bpt).div_ceil(4));
            assert_ne!(four.ids(), vec![4, 5, 6]);
        }
    }

    #[test]
    fn a_seed_changes_the_filler_not_the_blocks() {
        let seeded = Shape {
            bytes_per_token: 4,
            seed: 7,
        };
        let a = prompt_text(&[1, 2], 1024, Shape::default());
        let b = prompt_text(&[1, 2], 1024, seeded);
        assert_ne!(a, b);
        assert_eq!(parse_prompt(b.as_bytes(), seeded).ids(), vec![1, 2]);
        assert!(parse_prompt(b.as_bytes(), Shape::default())
            .ids()
            .is_empty());
    }

    #[test]
    fn shared_leading_ids_share_bytes_and_others_do_not() {
        let a = prompt_text(&[0, 1, 2], 1536, Shape::default());
        let b = prompt_text(&[0, 1, 9], 1536, Shape::default());
        const BLOCK_BYTES: usize = 2048;
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
        let p = parse_prompt(b"hello world, not a trace prompt", Shape::default());
        assert_eq!(p.ids(), Vec::<u64>::new());
        assert_eq!(p.tokens, 8);
        let forged = format!("#5;{}", "x".repeat(100));
        assert_eq!(
            parse_prompt(forged.as_bytes(), Shape::default()).ids(),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn token_ids_read_back_as_the_text_does() {
        for (ids, tokens) in [
            (&[3u64, 4][..], 600u32),
            (&[0, 7, 9], 1100),
            (&[5], 1),
            (&[], 0),
        ] {
            let p = parse_prompt(
                prompt_text(ids, tokens, Shape::default()).as_bytes(),
                Shape::default(),
            );
            assert_eq!(parse_token_ids(&token_ids(&p)), p, "{ids:?} {tokens}");
        }
        let foreign = parse_token_ids(&[1, 2, 3]);
        assert_eq!((foreign.ids(), foreign.tokens), (vec![], 3));
    }

    #[test]
    fn token_ids_follow_blocks() {
        let p = parse_prompt(
            prompt_text(&[3, 4], 600, Shape::default()).as_bytes(),
            Shape::default(),
        );
        let t = token_ids(&p);
        assert_eq!(t.len(), 600);
        let q = parse_prompt(
            prompt_text(&[3, 5], 600, Shape::default()).as_bytes(),
            Shape::default(),
        );
        let u = token_ids(&q);
        assert_eq!(t[..512], u[..512]);
        assert_ne!(t[512..], u[512..]);
    }
}
