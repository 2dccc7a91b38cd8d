//! What a client may say in vLLM's `kv_transfer_params`: vLLM reads
//! per-request settings there that are not hand-off data (LMCache's
//! `lmcache.*` keys, the offloading connector's `max_offload_tokens`,
//! `max_load_tokens`, `kv_load_tiers`), and those reach both legs. Keys a
//! hand-off owns are the router's or the engine's to write: a client that
//! sends one could forge a transfer source or the cached-token count vLLM
//! reports (`remote_prefill_cached_tokens`), so the request is refused.
//!
//! Owned, from vLLM 0.34's connectors: the NIXL pull and push keys
//! (`do_remote_*`, `remote_*`, `tp_size`, `dcp_size`, `pp_size`,
//! `transfer_mode`), Mooncake's and MoRIIO's `transfer_id` and
//! `is_request_leader`, the offloading P2P tier's role keys
//! (`remote_decoder`, `remote_prefiller`, `remote_kv_source`), LMCache's PD
//! `disagg_spec`, `prompt_token_ids` (which skips the chat template on any
//! request), and the engine's own `_`-prefixed markers.

use serde_json::value::RawValue;
use std::collections::BTreeMap;

const OWNED: [&str; 13] = [
    "do_remote_decode",
    "do_remote_prefill",
    "tp_size",
    "dcp_size",
    "pp_size",
    "transfer_mode",
    "transfer_id",
    "is_request_leader",
    "remote_decoder",
    "remote_prefiller",
    "remote_kv_source",
    "disagg_spec",
    "prompt_token_ids",
];

/// The offloading P2P tier's role keys before vLLM renamed them (llm-d-router
/// PR 2140, after vLLM's OffloadingConnector): `prefill` became
/// `remote_prefiller`, `decode` `remote_decoder`, `p2p` `remote_kv_source`.
/// A renamed engine ignores the old key without a word, so the transfer it
/// asks for silently does not happen: refused, naming the new key.
const RENAMED: [(&str, &str); 3] = [
    ("prefill", "remote_prefiller"),
    ("decode", "remote_decoder"),
    ("p2p", "remote_kv_source"),
];

/// Whether `key` in `kv_transfer_params` is hand-off data.
pub fn is_owned(key: &str) -> bool {
    OWNED.contains(&key) || key.starts_with("remote_") || key.starts_with('_')
}

/// Why a client's `kv_transfer_params` cannot go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    NotAnObject,
    /// The first hand-off key in it.
    Owned(String),
    /// A hand-off key under its name before vLLM renamed it.
    Renamed {
        old: String,
        new: &'static str,
    },
}

/// The members of a client's `kv_transfer_params` (raw JSON, as sent),
/// none of them owned.
pub fn kept(raw: &[u8]) -> Result<Vec<(String, String)>, Refused> {
    let map: BTreeMap<String, Box<RawValue>> =
        serde_json::from_slice(raw).map_err(|_| Refused::NotAnObject)?;
    if let Some((old, new)) = RENAMED.iter().find(|(old, _)| map.contains_key(*old)) {
        return Err(Refused::Renamed {
            old: (*old).to_owned(),
            new,
        });
    }
    if let Some(k) = map.keys().find(|k| is_owned(k)) {
        return Err(Refused::Owned(k.clone()));
    }
    Ok(map
        .into_iter()
        .map(|(k, v)| (k, v.get().to_owned()))
        .collect())
}

/// `object` (a JSON object's raw text: a hand-off's `kv_transfer_params`)
/// with `kept`'s members added after its own, those it already has left
/// out. The object's own bytes stay as they are.
pub fn merged(object: &str, kept: &[(String, String)]) -> Option<String> {
    let own: BTreeMap<String, Box<RawValue>> = serde_json::from_str(object).ok()?;
    let body = object.trim_end().strip_suffix('}')?.trim_end();
    let mut out = String::with_capacity(object.len() + 64);
    out.push_str(body);
    let mut empty = own.is_empty();
    for (k, v) in kept.iter().filter(|(k, _)| !own.contains_key(k)) {
        if !empty {
            out.push(',');
        }
        empty = false;
        out.push_str(&crate::body::json_string(k));
        out.push(':');
        out.push_str(v);
    }
    out.push('}');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_kept_and_hand_off_keys_refused() {
        let k = kept(br#"{"lmcache.tag.user":"u1","max_offload_tokens":0}"#).expect("kept");
        assert_eq!(
            k,
            vec![
                ("lmcache.tag.user".to_owned(), r#""u1""#.to_owned()),
                ("max_offload_tokens".to_owned(), "0".to_owned())
            ]
        );
        for key in [
            "remote_engine_id",
            "remote_prefill_cached_tokens",
            "do_remote_decode",
            "transfer_id",
            "_p_side_truncated",
            "prompt_token_ids",
        ] {
            let raw = format!(r#"{{"lmcache.tag.user":"u1","{key}":1}}"#);
            assert_eq!(
                kept(raw.as_bytes()),
                Err(Refused::Owned(key.to_owned())),
                "{key}"
            );
        }
        for (old, new) in [
            ("prefill", "remote_prefiller"),
            ("decode", "remote_decoder"),
            ("p2p", "remote_kv_source"),
        ] {
            let raw = format!(r#"{{"{old}":{{"kv_request_id":"x"}}}}"#);
            assert_eq!(
                kept(raw.as_bytes()),
                Err(Refused::Renamed {
                    old: old.to_owned(),
                    new
                })
            );
        }
        assert_eq!(kept(b"[1]"), Err(Refused::NotAnObject));
        assert_eq!(kept(b"{}"), Ok(Vec::new()));
    }

    #[test]
    fn merged_objects_keep_their_bytes_and_add_what_they_lack() {
        let k = vec![("lmcache.tag.user".to_owned(), r#""u1""#.to_owned())];
        assert_eq!(
            merged(
                r#"{"do_remote_decode":true, "n":{"x":18446744073709551615} }"#,
                &k
            )
            .as_deref(),
            Some(
                r#"{"do_remote_decode":true, "n":{"x":18446744073709551615},"lmcache.tag.user":"u1"}"#
            )
        );
        assert_eq!(
            merged("{}", &k).as_deref(),
            Some(r#"{"lmcache.tag.user":"u1"}"#)
        );
        let same = vec![("a".to_owned(), "2".to_owned())];
        assert_eq!(merged(r#"{"a":1}"#, &same).as_deref(), Some(r#"{"a":1}"#));
        assert_eq!(merged("not json", &k), None);
    }
}
