//! How an answer looks beyond its tokens: the engine flavor, the model it
//! names, the logprobs and echo the request asked for.

use crate::config::Flavor;
use crate::logprobs::{Asked, Prompt};

/// How an answer looks beyond its tokens, from what the request asked
/// (built by the dispatcher, which has the request).
#[derive(Clone, Debug, Default)]
pub struct Look {
    pub flavor: Option<Flavor>,
    /// The model the answer names: the adapter asked for, else the pod's.
    pub model: String,
    pub asked: Asked,
    /// The tokenised prompt, when echo or logprobs need it.
    pub prompt: Option<Prompt>,
    /// Prepended to every choice's text (echo).
    pub echo: Option<String>,
    /// Completions: the `logprobs` arrays start with the prompt tokens
    /// (echo + logprobs; not on an SGLang decode, which has no input
    /// logprobs).
    pub echo_logprobs: bool,
}

impl Look {
    pub fn flavor(&self) -> Flavor {
        self.flavor.unwrap_or(Flavor::Trtllm)
    }
}
