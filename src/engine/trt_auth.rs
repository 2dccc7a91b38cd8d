//! TensorRT-LLM's signed hand-off (`tensorrt_llm/serve/disagg_auth.py`,
//! PR 16002): a generation request whose `disaggregated_params` carry
//! `encoded_opaque_state` or `ctx_info_endpoint` is refused by a worker that
//! has `internal_request_auth_key` set unless it carries
//! `x-trtllm-disagg-auth: sha256=<hex HMAC-SHA256(key, payload)>`, payload
//! being Python's `json.dumps({"ctx_info_endpoint": ..., "encoded_opaque_state":
//! ...}, sort_keys=True, separators=(",", ":"))` (ASCII-escaped). Only those
//! two fields are signed; a list endpoint is signed as its first element.

use crate::error::EngineError;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

pub const HEADER: &str = "x-trtllm-disagg-auth";

/// The header value for `params` (the generation request's
/// `disaggregated_params`), or `None` when nothing in them is protected.
pub fn sign(key: &[u8], params: &[u8]) -> Result<Option<String>, EngineError> {
    let bad = |m: String| EngineError::BadPrefillAnswer(format!("disaggregated_params: {m}"));
    let v: Value = serde_json::from_slice(params).map_err(|e| bad(e.to_string()))?;
    let field = |k: &str| v.get(k).filter(|x| !x.is_null());
    let (endpoint, opaque) = (field("ctx_info_endpoint"), field("encoded_opaque_state"));
    if endpoint.is_none() && opaque.is_none() {
        return Ok(None);
    }
    let endpoint = match endpoint {
        Some(Value::Array(items)) => items.first(),
        other => other,
    };
    // sort_keys: "ctx_info_endpoint" < "encoded_opaque_state".
    let mut payload = String::from("{\"ctx_info_endpoint\":");
    python_json(&mut payload, endpoint).map_err(bad)?;
    payload.push_str(",\"encoded_opaque_state\":");
    python_json(&mut payload, opaque).map_err(bad)?;
    payload.push('}');
    let mut mac = Hmac::<Sha256>::new_from_slice(key)
        .map_err(|e| EngineError::Internal(format!("TensorRT-LLM auth key: {e}")))?;
    mac.update(payload.as_bytes());
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Some(format!("sha256={hex}")))
}

/// A string or null as Python's `json.dumps` writes it with its default
/// `ensure_ascii=True`: non-ASCII as `\uXXXX` (UTF-16, lower-case hex).
fn python_json(out: &mut String, v: Option<&Value>) -> Result<(), String> {
    let s = match v {
        None | Some(Value::Null) => {
            out.push_str("null");
            return Ok(());
        }
        Some(Value::String(s)) => s,
        Some(other) => return Err(format!("cannot sign a non-string value {other}")),
    };
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::sign;

    /// Vectors computed with Python's `hmac`, `hashlib` and `json` exactly
    /// as `disagg_auth.py` signs.
    #[test]
    fn signatures_match_tensorrt_llm() {
        let list = br#"{"request_type":"generation_only","ctx_request_id":4398046511104123,"disagg_request_id":4398046511104123,"encoded_opaque_state":"b3BhcXVl","ctx_info_endpoint":["tcp://10.0.0.1:5000","tcp://10.0.0.1:5001"],"first_gen_tokens":[791],"draft_tokens":null}"#;
        assert_eq!(
            sign(b"replace-with-a-random-shared-key", list)
                .unwrap()
                .as_deref(),
            Some("sha256=0b562fed33740896d7dc858e3b2b56d54a2b06fc8c18029e790ba387186b6a29")
        );
        let non_ascii = r#"{"request_type":"generation_only","ctx_request_id":1,"disagg_request_id":2,"encoded_opaque_state":"b3BhcXVl-é€","ctx_info_endpoint":"tcp://10.0.0.1:5000"}"#;
        assert_eq!(
            sign(b"secret", non_ascii.as_bytes()).unwrap().as_deref(),
            Some("sha256=7ba986e89294d895782d26552828a126073835780341761260cde412549724f8")
        );
        let no_endpoint = br#"{"request_type":"generation_only","ctx_request_id":1,"disagg_request_id":2,"encoded_opaque_state":"b3BhcXVl"}"#;
        assert_eq!(
            sign(b"secret", no_endpoint).unwrap().as_deref(),
            Some("sha256=dd0226a7360fb1d422781ed05d4db132774395583e9f79091e0113371cae3257")
        );
    }

    #[test]
    fn nothing_protected_is_not_signed() {
        let p =
            br#"{"request_type":"generation_only","ctx_request_id":1,"encoded_opaque_state":null}"#;
        assert_eq!(sign(b"k", p).unwrap(), None);
        assert!(
            sign(b"k", br#"{"ctx_info_endpoint":7}"#).is_err(),
            "not a string"
        );
    }
}
