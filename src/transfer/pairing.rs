//! Legs paired by an id the router mints, for agents whose pods find each
//! other by request id.

use crate::handoff::{Legs, PdContext};

/// Pairs the legs by `id`, an id the router minted: set as both legs'
/// `X-Request-Id`, and for `/v1/responses` and `/inference/v1/generate` as
/// the body's `request_id` too (vLLM reads their id from the body, not the
/// header). Never the client's id: two requests in flight with one id
/// would pair with each other's KV.
pub(crate) fn pair_by_request_id(ctx: &PdContext, legs: &mut Legs, id: &str) {
    let in_body = ctx.fields.api.id_in_body();
    for leg in [&mut legs.prefill, &mut legs.decode] {
        leg.set_header("x-request-id", id.to_owned());
        if in_body {
            leg.body.set_str("request_id", id);
        }
    }
}
