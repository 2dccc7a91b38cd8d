//! E/P/D (encoder disaggregation) through a real Envoy. vLLM: a chat
//! request's media items go to encoder pods, then the prefill consumes
//! their output (the mock prefill fails any item not encoded), then the
//! decode. The mocks enforce the encoder request (one item, one token, not
//! streamed) and each EC connector's hand-off. SGLang: the media reach the
//! prefill and the decode untouched (its prefill calls its own encoders).

use crate::harness::*;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const MODEL: &str = "test/epd";

fn image(name: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": format!("https://x/{name}.png")}})
}

/// A chat request with text and `items` (one repeated: encoded once).
fn media_chat(items: &[Value], stream: bool) -> String {
    let mut content = vec![json!({"type": "text", "text": "Which one is the cat?"})];
    content.extend(items.iter().cloned());
    if let Some(first) = items.first() {
        content.push(first.clone());
    }
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}],
           "max_tokens": 6, "stream": stream})
    .to_string()
}

struct Epd {
    encoders: Vec<Mock>,
    prefill: Mock,
    decode: Mock,
    envoy: Envoy,
    _storage: Option<Scratch>,
}

impl Epd {
    /// Two encoders and a P/D pair of vLLM NIXL pods, consuming encoder
    /// output with `ec` (`example` shares a directory); `encoder_args` go to
    /// each encoder.
    fn start(ec: &str, encoder_args: &[&str]) -> Epd {
        Epd::start_kv(ec, "nixl", encoder_args)
    }

    /// As [`Epd::start`], the P/D pair handing the KV off with `kv`.
    fn start_kv(ec: &str, kv: &str, encoder_args: &[&str]) -> Epd {
        let storage = (ec == "example").then(|| Scratch::new("ec"));
        let dir = storage.as_ref().map(|s| s.0.display().to_string());
        let mut shared = vec!["--engine", "vllm", "--ec-connector", ec];
        if let Some(d) = &dir {
            shared.extend(["--ec-storage", d.as_str()]);
        }
        let with = |role: &str, extra: &[&str]| -> Vec<String> {
            let mut a: Vec<String> = shared.iter().map(|s| s.to_string()).collect();
            a.extend(["--role".into(), role.into()]);
            a.extend(extra.iter().map(|s| s.to_string()));
            a
        };
        let args = |v: &[String]| v.iter().map(String::as_str).collect::<Vec<_>>().join(" ");
        let start = |name: &str, v: Vec<String>| {
            let line = args(&v);
            Mock::start(name, &line.split(' ').collect::<Vec<_>>())
        };
        let encoders = vec![
            start("enc-0", with("encode", encoder_args)),
            start("enc-1", with("encode", encoder_args)),
        ];
        let prefill = start("epd-prefill", with("prefill", &["--connector", kv]));
        let decode = Mock::start(
            "epd-decode",
            &["--engine", "vllm", "--role", "decode", "--connector", kv],
        );
        // No scrapes: the encoders' queues then all read 0 and a request's
        // items always go one to each, which the tests count on (a scrape
        // catching an encoder mid-call would send both to the other).
        let envoy = Envoy::start(&json!({
            "prefill_timeout_ms": 5000,
            "scrape_interval_ms": 0,
            "models": [{
                "name": MODEL, "engine": "vllm", "ec_connector": ec, "kv_connector": kv,
                "rolesets": [{
                    "name": "rs0",
                    "prefill": [prefill.endpoint()],
                    "decode": [decode.endpoint()],
                    "encode": encoders.iter().map(Mock::endpoint).collect::<Vec<_>>(),
                }]
            }, {
                "name": "test/no-encoders", "engine": "vllm", "ec_connector": ec,
                "rolesets": [{"prefill": [prefill.endpoint()], "decode": [decode.endpoint()]}]
            }]
        }));
        Epd {
            encoders,
            prefill,
            decode,
            envoy,
            _storage: storage,
        }
    }

    fn encoded(&self) -> Vec<Logged> {
        self.encoders.iter().flat_map(Mock::requests).collect()
    }
}

/// Sends a two-image request and checks it went encode → prefill → decode.
fn check_media_request(s: &Epd, stream: bool, id: &str) {
    let before = s.prefill.requests().len();
    let a = post(
        &s.envoy.url(CHAT),
        media_chat(&[image("cat"), image("dog")], stream),
        &[("x-request-id", id)],
    );
    assert_eq!(a.status, 200, "{}\n{}", a.body, s.envoy.log());
    assert_eq!(a.header("x-mock-kv"), Some("pulled"));
    assert_eq!(a.header("x-mock-pod"), Some("epd-decode"));
    if stream {
        assert_eq!(a.events().last().map(String::as_str), Some("[DONE]"));
    } else {
        assert!(a.json()["choices"][0]["message"]["content"].is_string());
    }
    // Two distinct items: one request each, spread over both encoders.
    let mine = |e: &Mock| -> Vec<String> {
        e.requests()
            .iter()
            .filter_map(|r| r.header("x-request-id").map(str::to_owned))
            .filter(|r| r.starts_with(&format!("{id}-enc-")))
            .collect()
    };
    let (on0, on1) = (mine(&s.encoders[0]), mine(&s.encoders[1]));
    assert_eq!((on0.len(), on1.len()), (1, 1), "{on0:?} {on1:?}");
    let mut ids = [on0, on1].concat();
    ids.sort_unstable();
    assert_eq!(ids, vec![format!("{id}-enc-0"), format!("{id}-enc-1")]);
    let p = s.prefill.requests();
    assert_eq!(p.len(), before + 1);
    let prefill = p.last().expect("prefill").json();
    assert_eq!(
        prefill["messages"][0]["content"].as_array().map(Vec::len),
        Some(4),
        "media intact"
    );
    let decode = s.decode.requests().pop().expect("decode");
    assert!(decode.raw("kv_transfer_params").is_some());
    assert!(decode.raw("ec_transfer_params").is_none(), "prefill only");
}

#[test]
fn vllm_nixl_media_go_to_encoders_then_prefill_then_decode() {
    let s = Epd::start("nixl", &[]);
    check_media_request(&s, false, "epd-1");
    check_media_request(&s, true, "epd-2");
    // The prefill got both encoders' entries, merged into one map.
    let p = s.prefill.requests();
    let ec: Value = serde_json::from_str(&p[0].raw("ec_transfer_params").expect("params")).unwrap();
    assert_eq!(ec.as_object().map(|m| m.len()), Some(2), "{ec}");
    // Text only: no encoder.
    let before = s.encoded().len();
    let text =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let a = post(&s.envoy.url(CHAT), text.to_string(), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(s.encoded().len(), before);
    assert_eq!(s.envoy.stat("wasmcustom.pd_router.encoder_requests"), 4);
    assert_eq!(s.envoy.stat("wasmcustom.pd_router.encoder_failed"), 0);
}

/// A concurrent KV hand-off (NIXL push: the decode leaves with the prefill)
/// works the same behind the encoders: the prefill still finds every item
/// encoded, and the decode gets its KV.
#[test]
fn vllm_nixl_push_hand_off_follows_the_encoders() {
    let s = Epd::start_kv("nixl", "nixl_push", &[]);
    check_media_request(&s, false, "epd-push-1");
    check_media_request(&s, true, "epd-push-2");
}

#[test]
fn vllm_example_encoders_fill_the_storage_the_prefill_reads() {
    let s = Epd::start("example", &[]);
    check_media_request(&s, false, "epd-ex");
    let p = s.prefill.requests();
    assert!(p[0].raw("ec_transfer_params").is_none(), "nothing to relay");
}

#[test]
fn media_without_encoders_is_503_and_a_bad_media_part_400() {
    let s = Epd::start("nixl", &[]);
    let body = media_chat(&[image("cat")], false).replace(MODEL, "test/no-encoders");
    let a = post(&s.envoy.url(CHAT), body, &[]);
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(a.error_message().contains("test/no-encoders"), "{}", a.body);
    let bad = json!({"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"uri": "https://x/cat.png"}}]}]});
    let a = post(&s.envoy.url(CHAT), bad.to_string(), &[]);
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(
        a.error_message().contains("messages[0].content[0]"),
        "{}",
        a.body
    );
    assert!(s.encoded().is_empty() && s.prefill.requests().is_empty());
}

#[test]
fn an_encoder_failure_is_a_502_naming_it_and_no_prefill_leaves() {
    let s = Epd::start("nixl", &["--fault", "status:500"]);
    let a = post(&s.envoy.url(CHAT), media_chat(&[image("cat")], false), &[]);
    assert_eq!(a.status, 502, "{}", a.body);
    let msg = a.error_message();
    assert!(msg.contains("encoder pod enc-"), "{msg}");
    assert!(
        s.prefill.requests().is_empty(),
        "no prefill after a failed encoder"
    );
    assert_eq!(s.envoy.stat("wasmcustom.pd_router.encoder_failed"), 1);
}

/// A prefill pod that encodes its own media (llm-d's `encode-prefill`,
/// `encodes: true`) gets the request with its media and no encoder is
/// called, though the roleset has encoders.
#[test]
fn a_prefill_that_encodes_its_own_media_gets_no_encoder_leg() {
    let enc = Mock::start(
        "self-enc",
        &[
            "--engine",
            "vllm",
            "--role",
            "encode",
            "--ec-connector",
            "nixl",
        ],
    );
    let prefill = Mock::start("self-prefill", &["--engine", "vllm", "--role", "prefill"]);
    let decode = Mock::start("self-decode", &["--engine", "vllm", "--role", "decode"]);
    let mut own = prefill.endpoint();
    own["encodes"] = true.into();
    let envoy = Envoy::start(&json!({"models": [{
        "name": MODEL, "engine": "vllm", "ec_connector": "nixl",
        "rolesets": [{"prefill": [own], "decode": [decode.endpoint()], "encode": [enc.endpoint()]}]
    }]}));
    let a = post(&envoy.url(CHAT), media_chat(&[image("cat")], false), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("prefill-target-pod"), Some("self-prefill"));
    assert!(enc.requests().is_empty(), "no encoder leg");
    let p = prefill.requests();
    assert!(p[0].raw("ec_transfer_params").is_none());
    assert_eq!(
        p[0].json()["messages"][0]["content"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );
}

#[test]
fn sglang_media_go_untouched_to_a_prefill_that_calls_its_own_encoders() {
    // SGLang's E/P/D has no router leg (docs/engines.md): a `--language-only`
    // prefill sends its media to its own `--encoder-urls`. The router's part
    // is the P/D split with the media parts byte for byte on both legs.
    let s = crate::engines::Setup::start("sglang", None, &[], &[]);
    let body = media_chat(&[image("cat"), image("dog")], false).replace(MODEL, &s.model);
    let a = post(&s.envoy.url(CHAT), body.clone(), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-mock-kv"), Some("pulled"));
    let sent = raw_member(body.as_bytes(), "messages");
    let (p, d) = (&s.prefill.requests()[0], &s.decode.requests()[0]);
    assert_eq!(p.raw("messages"), sent, "prefill messages");
    assert_eq!(d.raw("messages"), sent, "decode messages");
    assert_eq!(p.raw("ec_transfer_params"), None);
}
