//! TensorRT-LLM's signed disaggregated hand-off (`tensorrt_llm/serve/
//! disagg_auth.py`, PR #16002): a generation request whose
//! `disaggregated_params` carry `encoded_opaque_state` or
//! `ctx_info_endpoint` (not null) must have header
//! `x-trtllm-disagg-auth: sha256=<hex HMAC-SHA256(key, payload)>`, where
//! the payload is Python's
//! `json.dumps({"ctx_info_endpoint": ep, "encoded_opaque_state": eos},
//! sort_keys=True, separators=(",", ":")).encode("utf-8")`: `ep` the first
//! element of a list (null for an empty one), absent fields null,
//! `ensure_ascii` on.

use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;

pub const HEADER: &str = "x-trtllm-disagg-auth";
/// TensorRT-LLM's ValueError text, answered as a 400.
pub const INVALID: &str = "Invalid internal disaggregated request authentication";

/// Whether the request needs the header: either protected field not null.
pub fn required(params: &Map<String, Value>) -> bool {
    let set = |k: &str| params.get(k).is_some_and(|v| !v.is_null());
    set("encoded_opaque_state") || set("ctx_info_endpoint")
}

/// The exact bytes TensorRT-LLM signs.
pub fn payload(params: &Map<String, Value>) -> String {
    let endpoint = match params.get("ctx_info_endpoint") {
        Some(Value::Array(items)) => items.first().cloned().unwrap_or(Value::Null),
        Some(v) => v.clone(),
        None => Value::Null,
    };
    let state = params
        .get("encoded_opaque_state")
        .cloned()
        .unwrap_or(Value::Null);
    let mut signed = Map::new();
    signed.insert("ctx_info_endpoint".into(), endpoint);
    signed.insert("encoded_opaque_state".into(), state);
    py_dumps(&Value::Object(signed))
}

/// The header value for `params` signed with `key`.
pub fn sign(key: &str, params: &Map<String, Value>) -> String {
    // new_from_slice takes a key of any length (HMAC hashes long keys).
    let mut mac = match Hmac::<Sha256>::new_from_slice(key.as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(payload(params).as_bytes());
    let digest = mac.finalize().into_bytes();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Python's `json.dumps(v, sort_keys=True, separators=(",", ":"))` with
/// the default `ensure_ascii=True`.
pub fn py_dumps(v: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, v);
    out
}

fn write_value(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => out.push_str(&u.to_string()),
            (None, Some(i), _) => out.push_str(&i.to_string()),
            (None, None, Some(f)) => out.push_str(&py_float(f)),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // sort_keys: Python sorts str keys by code point, which is the
            // order of their UTF-8 bytes (BTreeMap's order, made explicit).
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(out, k);
                out.push(':');
                if let Some(v) = map.get(k) {
                    write_value(out, v);
                }
            }
            out.push('}');
        }
    }
}

/// A string as `json.encoder.py_encode_basestring_ascii` writes it: every
/// character outside ' '..='~' escaped (`\n`-style for the five short
/// escapes, `\u00XX` lowercase otherwise, surrogate pairs above U+FFFF).
fn write_str(out: &mut String, s: &str) {
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
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// Python's `float.__repr__`: the shortest digits that round-trip, fixed
/// notation for exponents -4..16, else `d.ddde+XX`.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "1.2345e-5".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    let body = if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        if exp < 0 {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else if exp + 1 >= n {
            format!("{digits}{}.0", "0".repeat((exp + 1 - n) as usize))
        } else {
            let (int, frac) = digits.split_at((exp + 1) as usize);
            format!("{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let mant = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{esign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(s: &str) -> Map<String, Value> {
        match serde_json::from_str(s).unwrap() {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    // The three vectors of /work/notes/contracts.md §5a, computed there with
    // Python's hmac/hashlib/json.
    #[test]
    fn vector_1_list_endpoint() {
        let p = params(
            r#"{"request_type":"generation_only","ctx_request_id":4398046511104123,"disagg_request_id":4398046511104123,"encoded_opaque_state":"b3BhcXVl","ctx_info_endpoint":["tcp://10.0.0.1:5000","tcp://10.0.0.1:5001"],"first_gen_tokens":[791],"draft_tokens":null}"#,
        );
        assert!(required(&p));
        assert_eq!(
            payload(&p),
            r#"{"ctx_info_endpoint":"tcp://10.0.0.1:5000","encoded_opaque_state":"b3BhcXVl"}"#
        );
        assert_eq!(
            sign("replace-with-a-random-shared-key", &p),
            "sha256=0b562fed33740896d7dc858e3b2b56d54a2b06fc8c18029e790ba387186b6a29"
        );
    }

    #[test]
    fn vector_2_non_ascii_state() {
        let p = params(
            r#"{"request_type":"generation_only","ctx_request_id":1,"disagg_request_id":2,"encoded_opaque_state":"b3BhcXVl-é€","ctx_info_endpoint":"tcp://10.0.0.1:5000"}"#,
        );
        assert_eq!(
            payload(&p),
            r#"{"ctx_info_endpoint":"tcp://10.0.0.1:5000","encoded_opaque_state":"b3BhcXVl-\u00e9\u20ac"}"#
        );
        assert_eq!(
            sign("secret", &p),
            "sha256=7ba986e89294d895782d26552828a126073835780341761260cde412549724f8"
        );
    }

    #[test]
    fn vector_3_endpoint_absent() {
        let p = params(
            r#"{"request_type":"generation_only","ctx_request_id":1,"disagg_request_id":2,"encoded_opaque_state":"b3BhcXVl"}"#,
        );
        assert_eq!(
            payload(&p),
            r#"{"ctx_info_endpoint":null,"encoded_opaque_state":"b3BhcXVl"}"#
        );
        assert_eq!(
            sign("secret", &p),
            "sha256=dd0226a7360fb1d422781ed05d4db132774395583e9f79091e0113371cae3257"
        );
    }

    #[test]
    fn required_only_for_protected_fields() {
        assert!(!required(&params(r#"{"request_type":"generation_only"}"#)));
        assert!(!required(&params(
            r#"{"encoded_opaque_state":null,"ctx_info_endpoint":null}"#
        )));
        assert!(required(&params(r#"{"ctx_info_endpoint":[]}"#)));
        assert_eq!(
            payload(&params(r#"{"ctx_info_endpoint":[]}"#)),
            r#"{"ctx_info_endpoint":null,"encoded_opaque_state":null}"#
        );
    }

    #[test]
    fn strings_escape_like_python() {
        // Expected values printed by Python 3.11 json.dumps.
        assert_eq!(
            py_dumps(&Value::String(
                "\u{7f}\u{0}\u{8}\u{c}\n\r\t\"\\/😀é\u{2028}".into()
            )),
            r#""\u007f\u0000\b\f\n\r\t\"\\/\ud83d\ude00\u00e9\u2028""#
        );
        assert_eq!(
            py_dumps(&serde_json::json!({"b": [1, -2, true, null], "a": {"z": 0, "é": 1}})),
            r#"{"a":{"z":0,"\u00e9":1},"b":[1,-2,true,null]}"#
        );
    }

    #[test]
    fn floats_like_python_repr() {
        // Python: json.dumps([1.0, 1e16, 1e-05, 0.0001, 123456789.123, 1e22,
        // -0.0, 5e-324, 1.7976931348623157e308, 12345678901234567.0])
        let cases = [
            (1.0, "1.0"),
            (1e16, "1e+16"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (123456789.123, "123456789.123"),
            (1e22, "1e+22"),
            (-0.0, "-0.0"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (12345678901234567.0, "1.2345678901234568e+16"),
            (0.5, "0.5"),
            (-2.5e-7, "-2.5e-07"),
            (1234.5, "1234.5"),
            (1e15, "1000000000000000.0"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float(f), want, "{f}");
        }
    }
}
