//! The models a pod serves, `--model` and its `--lora` adapters: the check
//! every request that names a model goes through, the name an answer
//! carries, and the `GET /v1/models` list, as vLLM 0.34 does them
//! (`serve/engine/serving.py` `_check_model`, `openai/models/serving.py`).

use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::{Config, Flavor};
use crate::error::{Checked, Fail};
use crate::multipart;

/// The context length the mock claims (`max_model_len` of the base card
/// and of `/tokenize`).
pub const MAX_MODEL_LEN: u64 = 32_768;

/// A request naming `named` (its `model` member or form field) may be
/// served here. No name, or an empty one, means the base model (vLLM's
/// `_is_model_supported`); without `--model` any name is served.
pub fn check(cfg: &Config, named: Option<&str>) -> Checked<()> {
    match named {
        None | Some("") => Ok(()),
        Some(m) if cfg.serves_model(m) => Ok(()),
        Some(m) => Err(Fail::unknown_model(m, &cfg.model)),
    }
}

/// The model an answer names: the adapter the request asked for, else the
/// pod's model (vLLM's `model_name(lora_request)`).
pub fn answered(cfg: &Config, named: Option<&str>) -> String {
    match named.and_then(|n| cfg.adapter(n)) {
        Some(a) => a.name.clone(),
        None => cfg.model.clone(),
    }
}

/// The model a body names, for the request log: a multipart form's
/// `model` field, else the JSON body's `model` member; `None` when it names
/// none (or not as a string) or cannot be read.
pub fn named(content_type: Option<&str>, body: &[u8]) -> Option<String> {
    if let Some(boundary) = content_type.and_then(multipart::boundary) {
        return multipart::text_field(body, &boundary, "model")
            .ok()
            .flatten();
    }
    #[derive(Deserialize)]
    struct Named {
        model: Option<Value>,
    }
    let named: Named = serde_json::from_slice(body).ok()?;
    named.model?.as_str().map(str::to_string)
}

fn owner(cfg: &Config) -> &'static str {
    match cfg.flavor() {
        Flavor::Vllm => "vllm",
        Flavor::Sglang => "sglang",
        Flavor::Trtllm => "tensorrt_llm",
    }
}

/// `GET /v1/models`: the base card (`root` the model, no `parent`), then
/// one card per adapter (`root` its path, `parent` the model,
/// `max_model_len` null).
pub fn list(cfg: &Config, created: u64) -> Value {
    let card = |id: &str, root: &str, parent: Option<&str>, len: Option<u64>| {
        json!({"id": id, "object": "model", "created": created, "owned_by": owner(cfg),
               "root": root, "parent": parent, "max_model_len": len})
    };
    let mut data = vec![card(&cfg.model, &cfg.model, None, Some(MAX_MODEL_LEN))];
    data.extend(
        cfg.adapters
            .iter()
            .map(|a| card(&a.name, &a.path, Some(&cfg.model), None)),
    );
    json!({"object": "list", "data": data})
}
