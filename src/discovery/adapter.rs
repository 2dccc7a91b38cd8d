//! AIBrix's `ModelAdapter` objects (`model.aibrix.ai/v1alpha1`): which pods
//! serve a LoRA adapter. AIBrix's ModelAdapter controller loads an adapter
//! on the pods it picks and lists them in `status.instances` (pod names in
//! the adapter's namespace); AIBrix's gateway routes the adapter's name
//! (`metadata.name`) to exactly those pods (`pkg/cache/informers.go`
//! `addModelAdapter`), and so does pd-router.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A LoRA adapter as discovery read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoveredAdapter {
    /// `metadata.name`: the `model` a request names it by (vLLM's
    /// `lora_name`, as AIBrix loads it).
    pub name: String,
    /// `spec.baseModel`, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// `status.instances`, sorted, named as discovery names pods (with
    /// their namespace when every namespace is listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<String>,
}

/// Reads a `ModelAdapterList`, sorted by name. `qualify`: pod names carry
/// their namespace (every namespace is listed). Adapters of one name in
/// two namespaces are one model name to AIBrix's gateway too: their
/// instances add up. (Read as a `Value`: the module already holds its
/// parser, and a few fields of a few objects need no typed one.)
pub fn read_adapters(body: &[u8], qualify: bool) -> Result<Vec<DiscoveredAdapter>, String> {
    let list: Value =
        serde_json::from_slice(body).map_err(|e| format!("not a ModelAdapterList: {e}"))?;
    match text(&list, &["kind"]) {
        Some("ModelAdapterList") => {}
        kind => {
            let kind = kind.unwrap_or("no kind");
            return Err(format!("{kind} where a ModelAdapterList belongs"));
        }
    }
    let mut out: Vec<DiscoveredAdapter> = Vec::new();
    let items = list.get("items").and_then(Value::as_array);
    for a in items.into_iter().flatten() {
        let name = text(a, &["metadata", "name"]).ok_or("an item has no metadata.name")?;
        let at = match out.binary_search_by(|x| x.name.as_str().cmp(name)) {
            Ok(at) => at,
            Err(at) => {
                let new = DiscoveredAdapter {
                    name: name.to_owned(),
                    base: None,
                    instances: Vec::new(),
                };
                out.insert(at, new);
                at
            }
        };
        let Some(entry) = out.get_mut(at) else {
            continue;
        };
        if entry.base.is_none() {
            entry.base = text(a, &["spec", "baseModel"]).map(str::to_owned);
        }
        let ns = text(a, &["metadata", "namespace"]).filter(|_| qualify);
        let instances = member(a, &["status", "instances"]).and_then(Value::as_array);
        let names = instances.into_iter().flatten().filter_map(Value::as_str);
        for pod in names.filter(|i| !i.is_empty()) {
            let pod = match ns {
                Some(ns) => format!("{ns}/{pod}"),
                None => pod.to_owned(),
            };
            if let Err(at) = entry.instances.binary_search(&pod) {
                entry.instances.insert(at, pod);
            }
        }
    }
    Ok(out)
}

/// The member at `path`, object by object.
fn member<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

/// The non-empty string at `path`.
fn text<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    member(v, path)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list as the API server answers it: custom resources keep their
    /// kind and apiVersion in the items.
    const LIST: &[u8] = br#"{"apiVersion":"model.aibrix.ai/v1alpha1","kind":"ModelAdapterList",
        "metadata":{"continue":"","resourceVersion":"4711"},
        "items":[
          {"apiVersion":"model.aibrix.ai/v1alpha1","kind":"ModelAdapter",
           "metadata":{"name":"sql-lora","namespace":"llm","resourceVersion":"4700"},
           "spec":{"baseModel":"llama","artifactURL":"huggingface://org/sql-lora",
                   "podSelector":{"matchLabels":{"model.aibrix.ai/name":"llama"}},
                   "schedulerName":"default","replicas":2},
           "status":{"phase":"Running","readyReplicas":2,"desiredReplicas":2,
                     "instances":["llama-d1","llama-d0"]}},
          {"apiVersion":"model.aibrix.ai/v1alpha1","kind":"ModelAdapter",
           "metadata":{"name":"chat-lora","namespace":"other"},
           "spec":{"podSelector":{"matchLabels":{"model.aibrix.ai/name":"llama"}},
                   "artifactURL":"s3://b/chat"},
           "status":{"phase":"Pending"}},
          {"apiVersion":"model.aibrix.ai/v1alpha1","kind":"ModelAdapter",
           "metadata":{"name":"sql-lora","namespace":"other"},
           "spec":{"artifactURL":"s3://b/sql"},
           "status":{"instances":["llama-d0",""]}}]}"#;

    #[test]
    fn an_adapter_names_the_pods_its_status_lists() {
        let read = read_adapters(LIST, false).expect("list");
        let view: Vec<(&str, Option<&str>, Vec<&str>)> = read
            .iter()
            .map(|a| {
                let i = a.instances.iter().map(String::as_str).collect();
                (a.name.as_str(), a.base.as_deref(), i)
            })
            .collect();
        assert_eq!(
            view,
            [
                ("chat-lora", None, vec![]),
                ("sql-lora", Some("llama"), vec!["llama-d0", "llama-d1"]),
            ]
        );
        // Listed over every namespace, instances carry their namespace.
        let qualified = read_adapters(LIST, true).expect("list");
        assert_eq!(
            qualified[1].instances,
            ["llm/llama-d0", "llm/llama-d1", "other/llama-d0"]
        );
    }

    #[test]
    fn anything_but_a_model_adapter_list_is_refused() {
        let empty = br#"{"kind":"ModelAdapterList","apiVersion":"model.aibrix.ai/v1alpha1","metadata":{},"items":[]}"#;
        assert_eq!(read_adapters(empty, false), Ok(Vec::new()));
        for body in [
            &br#"{"kind":"Status","status":"Failure","code":404}"#[..],
            b"{}",
            b"<html>",
            br#"{"kind":"ModelAdapterList","items":[{"spec":{}}]}"#,
        ] {
            assert!(read_adapters(body, false).is_err(), "{body:?}");
        }
    }
}
