//! Engine handlers: what each inference engine needs on the prefill leg and
//! how its prefill answer turns into the decode request (AIBrix `pd/engine`).

mod default;
mod handler;
mod sglang;
pub mod trt_auth;
mod trt_generation_first;
mod trtllm;
mod vllm;

use crate::api::{Api, ClientFields};
use crate::body::{Edits, Members};
use crate::error::ClientError;
use crate::fleet::Endpoint;
use std::collections::BTreeMap;

use crate::error::EngineError;
use crate::handoff::{IdSource, LegEdits, Legs, PdContext};
pub use default::DefaultHandler;
pub use handler::{EngineHandler, Merged, PrefillAnswer};
pub use sglang::SglangHandler;
pub use trt_generation_first::parse_server_info;
pub use trtllm::TrtllmHandler;
pub use vllm::VllmHandler;

/// Members whose contents a handler checks ([`EngineHandler::client_params`]):
/// a second copy is refused, since the router would check one and the
/// engine's JSON parser (Python's keeps the last) could read the other.
pub const CHECKED_MEMBERS: [&str; 1] = ["kv_transfer_params"];

/// Refuses a body that carries hand-off data `handler`'s engine reads and
/// the router owns: a top-level key of [`EngineHandler::owned_keys`], a
/// duplicated [`CHECKED_MEMBERS`] member, or what
/// [`EngineHandler::client_params`] refuses inside one; otherwise returns
/// the client's own settings that `client_params` keeps. Every body that
/// reaches a pod passes here first, split or not: a field an engine obeys
/// must not reach it from a client on any path.
pub fn refuse_owned(
    handler: &dyn EngineHandler,
    body: &[u8],
    top: &Members,
) -> Result<Option<Vec<(String, String)>>, ClientError> {
    if let Some(key) = handler.owned_keys().iter().find(|k| top.contains(k)) {
        return Err(ClientError::RouterOwnedKey {
            key: (*key).to_owned(),
            engine: handler.name().to_owned(),
        });
    }
    if let Some(dup) = top.first_duplicate(&CHECKED_MEMBERS) {
        return Err(ClientError::DuplicateKey(dup.to_owned()));
    }
    handler.client_params(body, top)
}

/// The names a multipart form may not carry for `handler`'s engine: its
/// owned keys and the members whose contents it checks (a form field's
/// text is not parsed; no engine's form API takes hand-off settings).
pub fn refused_form_fields(handler: &dyn EngineHandler) -> impl Iterator<Item = &'static str> {
    handler.owned_keys().iter().copied().chain(CHECKED_MEMBERS)
}

/// The prefill-leg constraints shared by every engine (the union used by
/// AIBrix, vLLM's proxy and llm-d): one token, no streaming, no minimums.
pub fn prefill_constraints(fields: &ClientFields, body: &[u8], top: &Members) -> Edits {
    let mut e = Edits::new();
    match fields.api.limits_member() {
        Some(member) => e.set_raw(member, sampling_limits(body, top, member)),
        None => e.set_u64(fields.api.max_tokens_key(), 1),
    }
    // vLLM's proxy only caps max_completion_tokens when the client sent it;
    // adding it elsewhere would be an unknown field on the completions API.
    if fields.api != Api::Responses && top.contains("max_completion_tokens") {
        e.set_u64("max_completion_tokens", 1);
    }
    e.set_bool("stream", false);
    e.remove("stream_options");
    e.remove("min_tokens");
    e.remove("min_completion_tokens");
    if fields.api == Api::Responses {
        // Only the prefill pod would store the one-token response, in its
        // own memory, where no later turn finds it (vLLM keeps the store
        // per pod); and a background prefill would answer before it ran.
        e.set_bool("store", false);
        e.set_bool("background", false);
    }
    e
}

/// The client's `member` object (vLLM's `sampling_params`) with one token
/// and no minimum, its other members byte for byte; `{"max_tokens":1}`
/// when it sent none. [`crate::api::read_fields`] checked it is an object.
fn sampling_limits(body: &[u8], top: &Members, member: &str) -> String {
    let mut limits = Edits::new();
    limits.set_u64("max_tokens", 1);
    limits.remove("min_tokens");
    let rendered = top.raw_non_null(body, member).and_then(|raw| {
        let inner = Members::parse(raw).ok()?;
        inner.render(raw, &limits).ok()
    });
    match rendered.and_then(|r| String::from_utf8(r).ok()) {
        Some(r) => r,
        None => "{\"max_tokens\":1}".to_owned(),
    }
}

/// Engine handlers by name; unknown names resolve to [`DefaultHandler`].
pub struct Registry {
    handlers: BTreeMap<&'static str, Box<dyn EngineHandler>>,
    fallback: DefaultHandler,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::builtin()
    }
}

impl Registry {
    /// A registry holding only the default handler.
    pub fn empty() -> Registry {
        let mut r = Registry {
            handlers: BTreeMap::new(),
            fallback: DefaultHandler,
        };
        r.register(Box::new(DefaultHandler));
        r
    }

    /// `vllm`, `sglang`, `trtllm` and `default`.
    pub fn builtin() -> Registry {
        let mut r = Registry::empty();
        r.register(Box::new(VllmHandler));
        r.register(Box::new(SglangHandler));
        r.register(Box::new(TrtllmHandler));
        r
    }

    /// Adds or replaces the handler for `handler.name()`.
    pub fn register(&mut self, handler: Box<dyn EngineHandler>) {
        self.handlers.insert(handler.name(), handler);
    }

    /// The handler for `name`; never nothing: unknown engines get the default.
    pub fn resolve(&self, name: &str) -> &dyn EngineHandler {
        self.handlers
            .get(name)
            .map(|h| h.as_ref())
            .unwrap_or(&self.fallback)
    }

    /// Whether `name` has a handler of its own.
    pub fn is_known(&self, name: &str) -> bool {
        self.handlers.contains_key(name)
    }

    /// Registered engine names, sorted.
    pub fn valid_engine_names(&self) -> Vec<&'static str> {
        self.handlers.keys().copied().collect()
    }
}

/// [`IdSource`] with fixed answers, for tests and golden fixtures.
#[derive(Debug, Clone, Default)]
pub struct FixedIds {
    /// Returned in turn by `random_u64`, cycling.
    pub randoms: Vec<u64>,
    /// Returned by `disagg_request_id`, incremented after each call.
    pub next_disagg_id: i64,
    drawn: usize,
}

impl FixedIds {
    pub fn new(randoms: Vec<u64>, next_disagg_id: i64) -> Self {
        FixedIds {
            randoms,
            next_disagg_id,
            drawn: 0,
        }
    }
}

impl IdSource for FixedIds {
    fn random_u64(&mut self) -> Result<u64, String> {
        if self.randoms.is_empty() {
            return Err("no randomness configured".into());
        }
        let v = self.randoms.get(self.drawn % self.randoms.len()).copied();
        self.drawn += 1;
        v.ok_or_else(|| "no randomness configured".into())
    }

    fn disagg_request_id(&mut self) -> i64 {
        let id = self.next_disagg_id;
        self.next_disagg_id += 1;
        id
    }
}

/// Builds both legs' edits: the common prefill constraints, then the engine's
/// augmentation.
pub fn build_legs(
    handler: &dyn EngineHandler,
    ctx: &mut PdContext,
    prefill_pod: &Endpoint,
) -> Result<Legs, EngineError> {
    let mut legs = Legs {
        prefill: LegEdits {
            body: prefill_constraints(ctx.fields, ctx.body, ctx.top),
            headers: Vec::new(),
        },
        decode: LegEdits::default(),
    };
    handler.augment_prefill_request(ctx, prefill_pod, &mut legs)?;
    Ok(legs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_resolves_unknown_names_to_default() {
        let r = Registry::builtin();
        assert_eq!(r.resolve("vllm").name(), "vllm");
        assert_eq!(r.resolve("sglang").name(), "sglang");
        assert_eq!(r.resolve("trtllm").name(), "trtllm");
        assert_eq!(r.resolve("something-else").name(), "default");
        assert!(!r.resolve("something-else").concurrent());
        assert!(!r.is_known("something-else"));
        assert_eq!(
            r.valid_engine_names(),
            vec!["default", "sglang", "trtllm", "vllm"]
        );
    }

    #[test]
    fn registered_handlers_replace_by_name() {
        struct Custom;
        impl EngineHandler for Custom {
            fn name(&self) -> &'static str {
                "vllm"
            }
            fn concurrent(&self) -> bool {
                true
            }
            fn augment_prefill_request(
                &self,
                _: &mut PdContext,
                _: &Endpoint,
                _: &mut Legs,
            ) -> Result<(), EngineError> {
                Ok(())
            }
            fn merge_prefill_response(
                &self,
                _: &mut PdContext,
                _: &PrefillAnswer,
                _: &Endpoint,
                _: &mut LegEdits,
            ) -> Result<Merged, EngineError> {
                Ok(Merged::Decode(None))
            }
        }
        let mut r = Registry::empty();
        assert_eq!(r.valid_engine_names(), vec!["default"]);
        r.register(Box::new(Custom));
        assert!(r.resolve("vllm").concurrent());
    }
}
