//! Stat names and their labels. Envoy's wasm stats have names, not labels,
//! so labels travel inside the name the way Istio encodes its extra stat
//! tags (`<name>.<tag>=.=<value>;.;`), and the `stats_tags` shipped in
//! `envoy.yaml` (`(<tag>=\.=(.*?);\.;)`) turn each into a Prometheus label:
//! `pd_router_pod_selected{pd_model="m",pd_role="decode",pd_pod="d-0"}`.
//! Values may hold dots (model names do); the tag names carry a `pd_`
//! prefix so they never collide with the `pod`/`namespace` labels
//! Kubernetes service discovery attaches.

use crate::fleet::Fleet;
use std::collections::HashMap;

/// The tags pd-router's stat names carry.
pub const TAGS: [&str; 8] = [
    "pd_model",
    "pd_roleset",
    "pd_role",
    "pd_pod",
    "pd_status",
    "pd_vm",
    "pd_reason",
    "pd_priority",
];

/// A value as a tag value: the encoding's separators (`;`, `=`) and
/// control characters become `_`.
pub fn tag_value(v: &str) -> String {
    v.chars()
        .map(|c| {
            if c == ';' || c == '=' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// `name` with `tags` encoded into it.
pub fn tagged(name: &str, tags: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(name.len() + 48);
    out.push_str(name);
    if !tags.is_empty() {
        out.push('.');
    }
    for (k, v) in tags {
        out.push_str(k);
        out.push_str("=.=");
        out.push_str(&tag_value(v));
        out.push_str(";.;");
    }
    out
}

/// Where a pod serves, for its labels: its first mention in the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLabels {
    pub model: String,
    pub roleset: String,
    /// `prefill`, `decode` or `combined`.
    pub role: &'static str,
}

/// Every pod's labels, by pod name.
pub fn pod_labels(fleet: &Fleet) -> HashMap<String, PodLabels> {
    let mut out = HashMap::new();
    for m in fleet.models() {
        for rs in &m.rolesets {
            for (role, pods) in [("prefill", &rs.prefill), ("decode", &rs.decode)] {
                for p in pods {
                    out.entry(p.name.clone()).or_insert_with(|| PodLabels {
                        model: m.name.clone(),
                        roleset: rs.name.clone(),
                        role,
                    });
                }
            }
        }
        for p in &m.combined {
            out.entry(p.name.clone()).or_insert_with(|| PodLabels {
                model: m.name.clone(),
                roleset: String::new(),
                role: "combined",
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn labels_are_encoded_as_istio_extra_stat_tags() {
        assert_eq!(
            tagged(
                "pd_router.pod.selected",
                &[("pd_model", "Qwen/Qwen3.5-8B"), ("pd_pod", "a;b=c")]
            ),
            "pd_router.pod.selected.pd_model=.=Qwen/Qwen3.5-8B;.;pd_pod=.=a_b_c;.;"
        );
    }

    #[test]
    fn each_pod_is_labelled_where_it_first_serves() {
        let c = Config::parse(
            br#"{"models":[{"name":"m","engine":"vllm","rolesets":[{"name":"r0","prefill":[{"address":"10.0.0.1:1","name":"p"}],"decode":[{"address":"10.0.0.2:1","name":"d"}]}],
                 "combined":[{"address":"10.0.0.3:1","name":"c"}]}]}"#,
        )
        .unwrap();
        let l = pod_labels(&c.fleet());
        assert_eq!(
            l["p"],
            PodLabels {
                model: "m".into(),
                roleset: "r0".into(),
                role: "prefill"
            }
        );
        assert_eq!(l["d"].role, "decode");
        assert_eq!((l["c"].role, l["c"].roleset.as_str()), ("combined", ""));
    }
}
