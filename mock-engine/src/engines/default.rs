//! The `default` engine: a plain OpenAI server with no KV hand-off, for
//! routers that only split the legs (or for recompute baselines).

use super::contract::prefill_constraints;
use crate::error::Checked;
use crate::leg::{DecodeOut, Kv, PrefillOut};
use crate::request::{approx_tokens, Request};

fn prompt_tokens(req: &Request<'_>) -> u64 {
    req.prompt_key().map(|k| approx_tokens(&k)).unwrap_or(0)
}

pub fn prefill(req: &Request<'_>, lenient: bool) -> Checked<PrefillOut> {
    prefill_constraints(req, true, lenient)?;
    Ok(PrefillOut::new(prompt_tokens(req)))
}

pub fn decode(req: &Request<'_>) -> DecodeOut {
    DecodeOut::new(Kv::None, prompt_tokens(req))
}
