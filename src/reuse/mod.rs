//! The next turn reuses the decode's KV (vLLM's bidirectional NIXL
//! transfer, PR 32553; `models[].kv_reuse`). A decode pod started with
//! `bidirectional_kv_xfer` keeps a finished request's blocks for
//! `decoder_kv_blocks_ttl` (480 s) and names them in its answer's
//! `kv_transfer_params`; the conversation's next prefill, sent those params
//! with `do_remote_decode` set, pulls the prefix from the decode pod
//! instead of computing it. The blocks serve one read.
//!
//! What the router keeps per session (a bounded table in shared data, one
//! slot per session by its key: a colliding session evicts the older) is a
//! [`Handle`]: the decode pod, the params, a deadline on the router's clock
//! and a guard. vLLM does not check that the new prompt extends the
//! sequence the blocks hold (vLLM issue 43094: wrong output, not an error),
//! so the router sends a handle only to a request whose history begins
//! with the turn that made it ([`History`]).

pub mod handle;
pub mod history;

pub use handle::{Handle, HandleStore};
pub use history::History;
