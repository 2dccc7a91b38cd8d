//! Helpers shared by the fuzz targets: an independent walk over a JSON
//! object's top-level members, JSON validity checks, and the engine /
//! connector / prefill-pod matrix the request targets run through.
#![allow(dead_code)] // each target uses a subset
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use pd_router::api::Api;
use pd_router::body::Members;
use pd_router::config::Config;
use pd_router::engine::{FixedIds, Registry};
use pd_router::handoff::LearnedPods;
use pd_router::split::{self, Placement, Plan, SplitContext, SplitPlan};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;
use std::rc::Rc;

pub const ENGINES: [&str; 4] = ["vllm", "sglang", "trtllm", "default"];
/// `None`: the model names no connector (the global default applies).
pub const CONNECTORS: [Option<&str>; 7] = [
    None,
    Some("nixl"),
    Some("shfs"),
    Some("neuron"),
    Some("mooncake"),
    Some("nixl_push"),
    Some("p2p_nccl"),
];
pub const APIS: [Api; 5] = [
    Api::Completions,
    Api::ChatCompletions,
    Api::Responses,
    Api::Messages,
    Api::Generate,
];

/// One model configuration of the matrix.
pub struct Case {
    pub engine: &'static str,
    pub connector: Option<&'static str>,
    pub config: Config,
    pub fleet: pd_router::fleet::Fleet,
}

/// Every engine × connector, each with three prefill pods: IPv4 with the
/// default bootstrap port and two data-parallel ranks, IPv6 with the
/// highest port, and one whose own `kv_connector` overrides the model's;
/// the decode has two ranks too.
fn build_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for engine in ENGINES {
        for connector in CONNECTORS {
            let mut model = serde_json::json!({
                "name": "m",
                "engine": engine,
                "rolesets": [{
                    "prefill": [
                        {"address": "10.0.0.1:8000", "dp_size": 2,
                         "nixl_push": {"engine_id": "p-0", "tp_size": 2}},
                        {"address": "[fd00::1]:8000", "bootstrap_port": 65535,
                         "nixl_push": {"engine_id": "p-é\"1", "side_channel_host": "fd00::9"}},
                        {"address": "10.0.0.3:8000", "kv_connector": "shfs"}
                    ],
                    "decode": [{"address": "10.9.9.9:8000", "dp_size": 2, "kv_port": 65535}]
                }]
            });
            if let Some(c) = connector {
                model["kv_connector"] = c.into();
            }
            // vLLM E/P/D: media parts go to encoder pods first; one EC
            // connector with NIXL pull, the other with the push connectors.
            let ec = match (engine, connector) {
                ("vllm", Some("nixl")) => Some("nixl"),
                ("vllm", Some("nixl_push" | "mooncake")) => Some("example"),
                _ => None,
            };
            if let Some(ec) = ec {
                model["ec_connector"] = ec.into();
                model["rolesets"][0]["encode"] =
                    serde_json::json!(["10.0.0.7:8000", "[fd00::7]:8000"]);
            }
            // TensorRT-LLM has no connectors: its cases that name one take
            // the base64 ids instead.
            if engine == "trtllm" && connector.is_some() {
                model["trt_token_ids_b64"] = true.into();
            }
            let json = serde_json::json!({ "models": [model] }).to_string();
            let config = Config::parse(json.as_bytes()).expect("harness config");
            out.push(Case {
                engine,
                connector,
                fleet: config.fleet(),
                config,
            });
        }
    }
    out
}

/// The matrix, built once per fuzzing thread (its `Rc`s stay on it).
pub fn cases() -> &'static [Case] {
    thread_local! {
        static CASES: &'static [Case] = Box::leak(build_cases().into_boxed_slice());
    }
    CASES.with(|c| *c)
}

thread_local! {
    pub static REGISTRY: Registry = Registry::builtin();
}

/// Asserts a header a leg sets is one Envoy can send: a lowercase name, a
/// value of visible ASCII, spaces and tabs.
pub fn assert_header(what: &str, (name, value): &(String, String)) {
    assert!(
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
        "header name {name:?} ({what})"
    );
    assert!(
        value
            .bytes()
            .all(|b| b == b'\t' || (0x20..0x7f).contains(&b)),
        "header {name} value {value:?} ({what})"
    );
}

/// FNV-1a: a stable hash of the input to derive values from.
pub fn hash(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `len` pseudo-random bytes seeded by `seed` (xorshift64*).
pub fn bytes_from(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// Randomness derived from the input: edge values plus the input's hash.
/// The disagg id stays far from `i64::MAX` (FixedIds increments it).
pub fn ids(data: &[u8]) -> FixedIds {
    let h = hash(data);
    FixedIds::new(vec![h, u64::MAX, 0, !h], (h >> 2) as i64)
}

/// Whether serde_json reads `bytes` as an object (as a `Value`: stricter than
/// the router's raw parse, which e.g. accepts numbers out of f64's range).
pub fn is_value_object(bytes: &[u8]) -> bool {
    matches!(
        serde_json::from_slice::<serde_json::Value>(bytes),
        Ok(serde_json::Value::Object(_))
    )
}

/// Asserts that a body the router produced is a JSON object: always as the
/// router reads bodies, and as a `serde_json::Value` when `strict` (its
/// inputs were readable that way).
pub fn assert_object(what: &str, bytes: &[u8], strict: bool) {
    if let Err(e) = Members::parse(bytes) {
        panic!(
            "{what} is not a JSON object ({e:?}):\n{}",
            String::from_utf8_lossy(bytes)
        );
    }
    if strict {
        match serde_json::from_slice::<serde_json::Value>(bytes) {
            Ok(serde_json::Value::Object(_)) => {}
            other => panic!(
                "{what} does not parse as a serde_json object ({other:?}):\n{}",
                String::from_utf8_lossy(bytes)
            ),
        }
    }
}

/// The top-level members of a JSON object, in order, duplicates included,
/// with each value's exact source text. Written apart from `Members` so the
/// two can be checked against each other.
pub fn members(src: &[u8]) -> Result<Vec<(String, &RawValue)>, serde_json::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<(String, &'de RawValue)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(k) = map.next_key::<String>()? {
                out.push((k, map.next_value::<&'de RawValue>()?));
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(src);
    let out = (&mut de).deserialize_map(V)?;
    de.end()?;
    Ok(out)
}

/// Asserts the SSE body of a short-circuited streaming answer: `data: X`
/// events, each a JSON object, ending with `data: [DONE]`.
pub fn assert_sse(body: &[u8]) {
    let text = std::str::from_utf8(body).expect("SSE answer is UTF-8");
    let events: Vec<&str> = text
        .strip_suffix("\n\n")
        .unwrap_or_else(|| panic!("SSE answer does not end with a blank line: {text:?}"))
        .split("\n\n")
        .collect();
    let (last, chunks) = events.split_last().expect("at least one event");
    assert_eq!(
        *last, "data: [DONE]",
        "SSE answer ends with [DONE]: {text:?}"
    );
    for chunk in chunks {
        let json = chunk
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("SSE event without data: {chunk:?}"));
        assert!(
            is_value_object(json.as_bytes()),
            "SSE event is not a JSON object: {chunk:?}"
        );
    }
}

/// Runs `f` on every split the router could make of `client`, through the
/// shipped [`split::read`] and [`split::build`]: each API, each engine × connector, each prefill
/// pod. What the plan rejects or does not split is skipped (that it rejects
/// without panicking is the check).
pub fn for_each_split(
    client: &[u8],
    mut f: impl FnMut(&Case, &SplitContext, &mut FixedIds, &SplitPlan),
) {
    REGISTRY.with(|registry| {
        for case in cases() {
            let fleet = &case.fleet;
            // Every Mooncake prefill's bootstrap server has answered: two ranks.
            let learned = LearnedPods {
                said: fleet
                    .models()
                    .iter()
                    .flat_map(|m| m.endpoints())
                    .map(|e| (e.id, vec!["e_dp0".into(), "e_dp1".into()]))
                    .collect(),
            };
            let mut view = SplitContext::of_config(&case.config, fleet, registry);
            view.learned = &learned;
            view.trt_auth_key = Some(b"fuzz-key");
            let roleset = &fleet.models()[0].rolesets[0];
            for api in APIS {
                for pod in &roleset.prefill {
                    let placement = Placement::Split {
                        prefill: Rc::clone(pod),
                        decode: Rc::clone(&roleset.decode[0]),
                        reason: "fixed",
                        prefix: Default::default(),
                        decided: None,
                    };
                    let mut ids = ids(client);
                    let plan = split::read(&view, api, "fuzz-1", client.to_vec())
                        .and_then(|r| split::build(&view, r, placement, &mut ids));
                    if let Ok(Plan::Split(plan)) = plan {
                        f(case, &view, &mut ids, &plan);
                    }
                }
            }
        }
    });
}
