//! The gateway's model list, as OpenAI's `GET /v1/models` gives it: every
//! model that has pods to place a request on, then its LoRA adapters with
//! `parent` set (vLLM's order). Answered by the gateway: the list of one
//! pod would name only that pod's models.

use crate::fleet::{Fleet, Model};
use serde_json::{json, Value};

/// `{"object":"list","data":[...]}`, `created` in Unix seconds (vLLM stamps
/// its cards at answer time too).
pub fn list(fleet: &Fleet, created: u64) -> Vec<u8> {
    let data: Vec<Value> = fleet
        .models()
        .iter()
        .filter(|m| m.is_routable())
        .flat_map(|m| cards(m, created))
        .collect();
    json!({"object": "list", "data": data})
        .to_string()
        .into_bytes()
}

/// The card of the model or adapter `id`, if the gateway serves it.
pub fn card(fleet: &Fleet, id: &str, created: u64) -> Option<Vec<u8>> {
    let served = fleet.serve(id)?;
    if !served.model.is_routable() {
        return None;
    }
    let card = match served.adapter {
        None => base_card(served.model, created),
        Some(a) => adapter_card(served.model, a, created),
    };
    Some(card.to_string().into_bytes())
}

fn cards(m: &Model, created: u64) -> Vec<Value> {
    let mut out = vec![base_card(m, created)];
    out.extend(m.adapters.iter().map(|a| adapter_card(m, a, created)));
    out
}

fn base_card(m: &Model, created: u64) -> Value {
    json!({
        "id": m.name,
        "object": "model",
        "created": created,
        "owned_by": m.engine,
        "root": m.name,
        "parent": null,
    })
}

fn adapter_card(m: &Model, adapter: &str, created: u64) -> Value {
    json!({
        "id": adapter,
        "object": "model",
        "created": created,
        "owned_by": m.engine,
        "root": adapter,
        "parent": m.name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

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
