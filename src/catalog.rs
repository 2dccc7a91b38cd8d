//! The gateway's model list, as OpenAI's `GET /v1/models` gives it: every
//! model that has pods to place a request on, then its LoRA adapters with
//! `parent` set (vLLM's order). Answered by the gateway: the list of one
//! pod would name only that pod's models.

use crate::body::push_json_str;
use crate::fleet::{Fleet, Model};

/// `{"object":"list","data":[...]}`, `created` in Unix seconds (vLLM stamps
/// its cards at answer time too).
pub fn list(fleet: &Fleet, created: u64) -> Vec<u8> {
    let mut out = b"{\"object\":\"list\",\"data\":[".to_vec();
    let mut first = true;
    for m in fleet.models().iter().filter(|m| m.is_routable()) {
        let adapters = m
            .adapters
            .iter()
            .map(|a| (a.as_str(), Some(m.name.as_str())));
        for (id, parent) in std::iter::once((m.name.as_str(), None)).chain(adapters) {
            if !first {
                out.push(b',');
            }
            first = false;
            push_card(&mut out, m, id, parent, created);
        }
    }
    out.extend_from_slice(b"]}");
    out
}

/// The card of the model or adapter `id`, if the gateway serves it.
pub fn card(fleet: &Fleet, id: &str, created: u64) -> Option<Vec<u8>> {
    let served = fleet.serve(id)?;
    if !served.model.is_routable() {
        return None;
    }
    let m = served.model;
    let mut out = Vec::new();
    match served.adapter {
        None => push_card(&mut out, m, &m.name, None, created),
        Some(a) => push_card(&mut out, m, a, Some(&m.name), created),
    }
    Some(out)
}

/// One card: an adapter is its own root, with its base model as parent
/// (the gateway does not know the adapter's path, vLLM's `root`).
fn push_card(out: &mut Vec<u8>, m: &Model, id: &str, parent: Option<&str>, created: u64) {
    out.extend_from_slice(b"{\"id\":");
    push_json_str(out, id);
    out.extend_from_slice(b",\"object\":\"model\",\"created\":");
    out.extend_from_slice(created.to_string().as_bytes());
    out.extend_from_slice(b",\"owned_by\":");
    push_json_str(out, &m.engine);
    out.extend_from_slice(b",\"root\":");
    push_json_str(out, id);
    out.extend_from_slice(b",\"parent\":");
    match parent {
        Some(p) => push_json_str(out, p),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use serde_json::Value;

    fn fleet() -> Fleet {
        Config::parse(
            br#"{"models":[
              {"name":"a","engine":"vllm","adapters":["a-sql","a-chat"],
               "rolesets":[{"prefill":["10.0.0.1:1"],"decode":["10.0.0.2:1"]}]},
              {"name":"b","engine":"sglang","combined":["10.0.0.3:1"]},
              {"name":"c","engine":"vllm","rolesets":[{"decode":["10.0.0.4:1"]}]}]}"#,
        )
        .expect("config")
        .fleet()
    }

    #[test]
    fn lists_routable_models_then_their_adapters() {
        let v: Value = serde_json::from_slice(&list(&fleet(), 7)).expect("json");
        assert_eq!(v["object"], "list");
        let ids: Vec<&str> = v["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|c| c["id"].as_str().expect("id"))
            .collect();
        assert_eq!(ids, ["a", "a-sql", "a-chat", "b"], "c has no prefill pod");
        let sql = &v["data"][1];
        assert_eq!(sql["parent"], "a");
        assert_eq!(sql["object"], "model");
        assert_eq!(sql["created"], 7);
        assert_eq!(v["data"][0]["parent"], Value::Null);
        assert_eq!(v["data"][3]["owned_by"], "sglang");
    }

    #[test]
    fn one_card_by_id() {
        let f = fleet();
        let one: Value = serde_json::from_slice(&card(&f, "a-chat", 1).expect("card")).unwrap();
        assert_eq!(
            (one["id"].as_str(), one["parent"].as_str()),
            (Some("a-chat"), Some("a"))
        );
        assert!(card(&f, "c", 1).is_none());
        assert!(card(&f, "zzz", 1).is_none());
    }
}
