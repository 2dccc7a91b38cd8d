//! Prefill and decode pods in one process, on loopback listeners, driven
//! over HTTP: the usage (cached tokens) and prompt-logprob rules across a
//! real hand-off.

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::state::{AppState, Bound};
use crate::{bootstrap, cli, peer, server, sidechannel, zmq};

pub(crate) struct Pod {
    pub(crate) http: SocketAddr,
    pub(crate) bootstrap: Option<SocketAddr>,
}

async fn listen() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let a = l.local_addr().expect("addr");
    (l, a)
}

fn serve(l: TcpListener, r: axum::Router) {
    tokio::spawn(async move { axum::serve(l, r).await });
}

pub(crate) async fn pod(args: &str) -> Pod {
    start(format!("{args} --quiet --stream-delay-ms 0")).await
}

/// A pod that keeps its request log (`/debug/requests`) and logs to stderr.
pub(crate) async fn recording_pod(args: &str) -> Pod {
    start(format!("{args} --stream-delay-ms 0")).await
}

async fn start(line: String) -> Pod {
    let config = cli::parse(std::iter::once("mock-engine").chain(line.split_whitespace()))
        .expect("valid flags");
    let (http, http_addr) = listen().await;
    let side = if config.needs_side_channel() {
        Some(listen().await)
    } else {
        None
    };
    let boot = if config.needs_bootstrap() {
        Some(listen().await)
    } else {
        None
    };
    let zmq_l = if config.needs_zmq() {
        Some(listen().await)
    } else {
        None
    };
    let bound = Bound {
        http: http_addr,
        side: side.as_ref().map(|s| s.1),
        bootstrap: boot.as_ref().map(|b| b.1),
        zmq: zmq_l.as_ref().map(|z| z.1),
    };
    let state = Arc::new(AppState::new(
        config,
        bound,
        peer::Peers::new(false).expect("client"),
    ));
    serve(http, server::main_router(state.clone()));
    if let Some((l, _)) = side {
        serve(l, sidechannel::router(state.clone()));
    }
    if let Some((l, _)) = boot {
        serve(l, bootstrap::router(state.clone()));
    }
    if let Some((l, _)) = zmq_l {
        serve(l, zmq::router(state.clone()));
    }
    Pod {
        http: http_addr,
        bootstrap: bound.bootstrap,
    }
}

pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) kv: String,
    pub(crate) text: String,
}

impl Answer {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }

    /// The `data:` events of an SSE body, `[DONE]` left out.
    pub(crate) fn events(&self) -> Vec<Value> {
        self.text
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).expect("json event"))
            .collect()
    }
}

pub(crate) async fn post(pod: &Pod, path: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let mut req = client
        .post(format!("http://{}{path}", pod.http))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("answer");
    let status = resp.status().as_u16();
    let kv = resp
        .headers()
        .get("x-mock-kv")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let text = resp.text().await.expect("body");
    Answer { status, kv, text }
}

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";
/// Non-ASCII, so the prompt text differs from its JSON bytes.
pub(crate) const PROMPT: &str = "Il était une fois, à Paris, un mock";

fn prompt_tokens() -> u64 {
    crate::request::approx_tokens(json!(PROMPT).to_string().as_bytes())
}

fn prefill_leg(mut client: Value) -> Value {
    client["max_tokens"] = json!(1);
    client["stream"] = json!(false);
    client["kv_transfer_params"] = json!({"do_remote_decode": true});
    client
}

fn cached(usage: &Value) -> &Value {
    &usage["prompt_tokens_details"]["cached_tokens"]
}

/// A vLLM NIXL pair: the prefill's answer and the decode body that relays
/// its `kv_transfer_params` verbatim.
async fn nixl_prefill(prefill: &Pod, client: &Value) -> (Value, Value) {
    let p = post(prefill, COMPLETIONS, &prefill_leg(client.clone()), &[]).await;
    assert_eq!(p.status, 200, "{}", p.text);
    let pj = p.json();
    let mut d = client.clone();
    d["kv_transfer_params"] = pj["kv_transfer_params"].clone();
    (pj, d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_nixl_cached_tokens_producer_and_consumer() {
    let prefill = pod("--engine vllm --role prefill --cached-tokens 5").await;
    let decode = pod("--engine vllm --role decode").await;
    let p_tokens = prompt_tokens();
    let client = json!({"model": "m", "prompt": PROMPT, "max_tokens": 3});

    let (pj, d) = nixl_prefill(&prefill, &client).await;
    assert_eq!(
        pj["usage"],
        json!({"prompt_tokens": p_tokens, "completion_tokens": 1,
               "total_tokens": p_tokens + 1, "prompt_tokens_details": {"cached_tokens": 5}})
    );
    assert_eq!(pj["kv_transfer_params"]["remote_prefill_cached_tokens"], 5);
    // vLLM >= 0.31: the decode reports the relayed count.
    let a = post(&decode, COMPLETIONS, &d, &[]).await;
    assert_eq!((a.status, a.kv.as_str()), (200, "pulled"), "{}", a.text);
    let aj = a.json();
    assert_eq!(
        aj["usage"],
        json!({"prompt_tokens": p_tokens, "completion_tokens": 3,
               "total_tokens": p_tokens + 3, "prompt_tokens_details": {"cached_tokens": 5}})
    );
    assert_eq!(aj["choices"][0]["prompt_logprobs"], Value::Null);

    // Without the field (a router that rebuilt the params, or vLLM < 0.31):
    // the transfer counts as cached, the whole prompt.
    let (_, mut d) = nixl_prefill(&prefill, &client).await;
    if let Some(p) = d["kv_transfer_params"].as_object_mut() {
        p.remove("remote_prefill_cached_tokens");
    }
    let a = post(&decode, COMPLETIONS, &d, &[]).await;
    assert_eq!(a.kv, "pulled", "{}", a.text);
    assert_eq!(*cached(&a.json()["usage"]), json!(p_tokens));

    // A forged count is reported unchecked, as vLLM 0.33 does.
    let (_, mut d) = nixl_prefill(&prefill, &client).await;
    d["kv_transfer_params"]["remote_prefill_cached_tokens"] = json!(-3);
    let a = post(&decode, COMPLETIONS, &d, &[]).await;
    assert_eq!(*cached(&a.json()["usage"]), json!(-3));

    // Streamed: the final usage chunk (only with include_usage).
    let (_, mut d) = nixl_prefill(&prefill, &client).await;
    d["stream"] = json!(true);
    d["stream_options"] = json!({"include_usage": true});
    let a = post(&decode, COMPLETIONS, &d, &[]).await;
    let ev = a.events();
    let last = ev.last().expect("events");
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["object"], "text_completion");
    assert_eq!(*cached(&last["usage"]), json!(5));
    assert!(ev[..ev.len() - 1].iter().all(|e| e.get("usage").is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_before_0_31_and_without_details() {
    let p_tokens = prompt_tokens();
    let client = json!({"model": "m", "prompt": PROMPT, "max_tokens": 2});
    // vLLM < 0.31 on both pods: no field, the decode reports the transfer.
    let prefill =
        pod("--engine vllm --role prefill --cached-tokens 5 --no-remote-cached-field").await;
    let decode = pod("--engine vllm --role decode --no-remote-cached-field").await;
    let (pj, mut d) = nixl_prefill(&prefill, &client).await;
    assert!(pj["kv_transfer_params"]
        .get("remote_prefill_cached_tokens")
        .is_none());
    assert_eq!(*cached(&pj["usage"]), json!(5));
    // An old decode ignores the field even when it is there.
    d["kv_transfer_params"]["remote_prefill_cached_tokens"] = json!(5);
    let a = post(&decode, COMPLETIONS, &d, &[]).await;
    assert_eq!(*cached(&a.json()["usage"]), json!(p_tokens));

    // Without --enable-prompt-tokens-details: null (both roles).
    let prefill =
        pod("--engine vllm --role prefill --cached-tokens 5 --no-prompt-tokens-details").await;
    let decode = pod("--engine vllm --role decode --no-prompt-tokens-details").await;
    let (pj, mut d) = nixl_prefill(&prefill, &client).await;
    assert_eq!(pj["usage"]["prompt_tokens_details"], Value::Null);
    assert!(pj["usage"]
        .as_object()
        .unwrap()
        .contains_key("prompt_tokens_details"));
    // The field still rides in the params (it does not need the flag).
    assert_eq!(pj["kv_transfer_params"]["remote_prefill_cached_tokens"], 5);
    let a = post(&decode, COMPLETIONS, &d.clone(), &[]).await;
    assert_eq!(a.json()["usage"]["prompt_tokens_details"], Value::Null);
    // Streamed, vLLM leaves the null out of the final usage chunk.
    let (_, d2) = nixl_prefill(&prefill, &client).await;
    d = d2;
    d["stream"] = json!(true);
    d["stream_options"] = json!({"include_usage": true});
    let a = post(&decode, COMPLETIONS, &d, &[]).await;
    let last = a.events().pop().expect("usage");
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": p_tokens, "completion_tokens": 2, "total_tokens": p_tokens + 2})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_recompute_reports_its_own_hits() {
    let decode = pod("--engine vllm --role decode --allow-recompute --cached-tokens 4").await;
    let a = post(
        &decode,
        CHAT,
        &json!({"messages": [{"role": "user", "content": "a fairly long question"}], "max_tokens": 1}),
        &[],
    )
    .await;
    assert_eq!(a.kv, "recomputed");
    let aj = a.json();
    assert_eq!(*cached(&aj["usage"]), json!(4));
    assert_eq!(aj["prompt_logprobs"], Value::Null);
    // Clamped to the prompt.
    let decode = pod("--engine vllm --role decode --allow-recompute --cached-tokens 1000").await;
    let a = post(
        &decode,
        COMPLETIONS,
        &json!({"prompt": "ab", "max_tokens": 1}),
        &[],
    )
    .await;
    assert_eq!(*cached(&a.json()["usage"]), json!(1));
    assert_eq!(a.json()["usage"]["prompt_tokens"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_mooncake_and_push_producers() {
    let p_tokens = prompt_tokens();
    // Mooncake: no kv_transfer_params in the prefill's answer; the decode,
    // sent at the same time, reports the transfer.
    let prefill = pod("--engine vllm --role prefill --connector mooncake --cached-tokens 3").await;
    let decode = pod("--engine vllm --role decode --connector mooncake").await;
    let boot = prefill.bootstrap.expect("bootstrap");
    let query: Value = reqwest::get(format!("http://{boot}/query"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let engine = query["0"]["engine_id"].as_str().unwrap().to_string();
    let client = json!({"prompt": PROMPT, "max_tokens": 2});
    let mut p = prefill_leg(client.clone());
    p["kv_transfer_params"]["transfer_id"] = json!("t1");
    let mut d = client.clone();
    d["kv_transfer_params"] = json!({"do_remote_prefill": true, "remote_engine_id": engine,
        "remote_bootstrap_addr": format!("http://{boot}"), "transfer_id": "t1"});
    let (pa, da) = tokio::join!(
        post(&prefill, COMPLETIONS, &p, &[]),
        post(&decode, COMPLETIONS, &d, &[])
    );
    let pj = pa.json();
    assert!(pj.get("kv_transfer_params").is_none(), "{pj}");
    assert_eq!(*cached(&pj["usage"]), json!(3));
    assert_eq!(da.kv, "pulled", "{}", da.text);
    assert_eq!(*cached(&da.json()["usage"]), json!(p_tokens));

    // NIXL push: the prefill's params carry its count.
    let prefill = pod("--engine vllm --role prefill --connector nixl_push --cached-tokens 3").await;
    let mut p = prefill_leg(client.clone());
    p["request_id"] = json!("push-1");
    let pj = post(&prefill, COMPLETIONS, &p, &[]).await.json();
    assert_eq!(pj["kv_transfer_params"]["remote_prefill_cached_tokens"], 3);
    assert_eq!(pj["kv_transfer_params"]["transfer_mode"], "push");
    let prefill =
        pod("--engine vllm --role prefill --connector nixl_push --no-remote-cached-field").await;
    let pj = post(&prefill, COMPLETIONS, &p, &[]).await.json();
    assert!(pj["kv_transfer_params"]
        .get("remote_prefill_cached_tokens")
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_responses_cached_tokens() {
    let prefill = pod("--engine vllm --role prefill --cached-tokens 2").await;
    let decode = pod("--engine vllm --role decode").await;
    let p = json!({"input": "Bonjour tout le monde", "max_output_tokens": 1, "store": false,
                   "kv_transfer_params": {"do_remote_decode": true}});
    let pj = post(&prefill, "/v1/responses", &p, &[]).await.json();
    assert_eq!(
        pj["usage"]["input_tokens_details"],
        json!({"cached_tokens": 2})
    );
    assert_eq!(pj["kv_transfer_params"]["remote_prefill_cached_tokens"], 2);
    let d = json!({"input": "Bonjour tout le monde", "max_output_tokens": 3, "stream": true,
                   "kv_transfer_params": pj["kv_transfer_params"]});
    let a = post(&decode, "/v1/responses", &d, &[]).await;
    assert_eq!(a.kv, "pulled");
    let last = a.events().pop().expect("terminal event");
    assert_eq!(last["type"], "response.incomplete");
    assert_eq!(
        last["response"]["usage"],
        json!({"input_tokens": 6, "input_tokens_details": {"cached_tokens": 2},
               "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": 9})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_prompt_logprobs_make_the_decode_recompute() {
    let prefill = pod("--engine vllm --role prefill --cached-tokens 5").await;
    let decode = pod("--engine vllm --role decode").await;
    let p_tokens = prompt_tokens();
    let client = json!({"prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": 1});
    let (pj, d) = nixl_prefill(&prefill, &client).await;
    // The prefill answers them, and skipped its prefix cache.
    let plp = pj["choices"][0]["prompt_logprobs"]
        .as_array()
        .expect("list");
    assert_eq!(plp.len() as u64, p_tokens);
    assert_eq!(plp[0], Value::Null);
    assert_eq!(*cached(&pj["usage"]), json!(0));
    assert_eq!(pj["kv_transfer_params"]["remote_prefill_cached_tokens"], 0);
    // A decode given prompt_logprobs with the hand-off ignores the KV.
    let a = post(&decode, COMPLETIONS, &d, &[]).await;
    assert_eq!((a.status, a.kv.as_str()), (200, "recomputed"), "{}", a.text);
    assert_eq!(
        a.json()["choices"][0]["prompt_logprobs"],
        pj["choices"][0]["prompt_logprobs"]
    );
    // The prefill's KV was never pulled: still there for a decode without them.
    let mut d2 = d.clone();
    d2.as_object_mut().unwrap().remove("prompt_logprobs");
    let a = post(&decode, COMPLETIONS, &d2, &[]).await;
    assert_eq!(a.kv, "pulled", "{}", a.text);

    // Completions echo + logprobs, and chat echo, do the same.
    let client = json!({"prompt": PROMPT, "max_tokens": 2, "echo": true, "logprobs": 0});
    let (_, d) = nixl_prefill(&prefill, &client).await;
    assert_eq!(post(&decode, COMPLETIONS, &d, &[]).await.kv, "recomputed");
    let msgs = json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "Once"}]);
    let mut p = prefill_leg(json!({"messages": msgs, "max_tokens": 2, "echo": true}));
    let pa = post(&prefill, CHAT, &p, &[]).await;
    let pj = pa.json();
    assert_eq!(pj["choices"][0]["message"]["content"], "OnceP");
    assert!(pj["prompt_logprobs"].is_array());
    p = json!({"messages": msgs, "max_tokens": 2, "echo": true,
               "kv_transfer_params": pj["kv_transfer_params"]});
    let a = post(&decode, CHAT, &p, &[]).await;
    assert_eq!(a.kv, "recomputed", "{}", a.text);
    assert_eq!(
        a.json()["choices"][0]["message"]["content"],
        "Oncetok0 tok1"
    );
    // Echo without logprobs on completions needs no prompt logprobs.
    let client = json!({"prompt": PROMPT, "max_tokens": 2, "echo": true});
    let (pj, d) = nixl_prefill(&prefill, &client).await;
    assert_eq!(pj["choices"][0]["text"], format!("{PROMPT}P"));
    let a = post(&decode, COMPLETIONS, &d, &[]).await;
    assert_eq!(a.kv, "pulled");
    assert_eq!(a.json()["choices"][0]["text"], format!("{PROMPT}tok0 tok1"));

    // With no hand-off at all it is the usual silent recompute: refused.
    let a = post(&decode, COMPLETIONS, &client_with_pl(), &[]).await;
    assert_eq!(a.status, 422, "{}", a.text);
}

fn client_with_pl() -> Value {
    json!({"prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": 1})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_prompt_logprobs_stream_is_a_400() {
    let decode = pod("--engine vllm --role decode --allow-recompute").await;
    for path in [COMPLETIONS, CHAT] {
        let body = json!({"prompt": "x", "messages": [], "prompt_logprobs": 2, "stream": true});
        let a = post(&decode, path, &body, &[]).await;
        assert_eq!(a.status, 400, "{}", a.text);
        assert_eq!(
            a.json()["error"],
            json!({"message": "`prompt_logprobs` are not available when `stream=True`.",
                   "type": "BadRequestError", "code": 400})
        );
    }
    // Completions echo + logprobs may stream: the first chunk echoes.
    let body = json!({"prompt": "Hello!", "max_tokens": 2, "echo": true, "logprobs": 1,
                      "stream": true});
    let a = post(&decode, COMPLETIONS, &body, &[]).await;
    assert_eq!((a.status, a.kv.as_str()), (200, "recomputed"));
    let ev = a.events();
    assert_eq!(ev[0]["choices"][0]["text"], "Hello!tok0");
    assert_eq!(ev[0]["choices"][0]["logprobs"]["tokens"][2], "tok0");
    assert_eq!(ev[1]["choices"][0]["logprobs"]["text_offset"], json!([10]));
}

/// The merge a router does for completions echo + logprobs (the
/// recommendation of notes 3.5): the prefill's prompt part before the
/// decode's generated part, offsets shifted by the prompt text.
fn merge_echo(p: &Value, d: &Value) -> Value {
    let mut out = d.clone();
    let pc = &p["choices"][0];
    let n = pc["prompt_logprobs"].as_array().unwrap().len();
    let plp = &pc["logprobs"];
    let prompt_text: String = plp["tokens"].as_array().unwrap()[..n]
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let shift = prompt_text.chars().count() as u64;
    let c = &mut out["choices"][0];
    c["text"] = json!(format!("{prompt_text}{}", c["text"].as_str().unwrap()));
    c["prompt_logprobs"] = pc["prompt_logprobs"].clone();
    for key in ["tokens", "token_logprobs", "top_logprobs"] {
        let mut v = plp[key].as_array().unwrap()[..n].to_vec();
        v.extend(c["logprobs"][key].as_array().unwrap().iter().cloned());
        c["logprobs"][key] = json!(v);
    }
    let mut offsets = plp["text_offset"].as_array().unwrap()[..n].to_vec();
    offsets.extend(
        c["logprobs"]["text_offset"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| json!(o.as_u64().unwrap() + shift)),
    );
    c["logprobs"]["text_offset"] = json!(offsets);
    out["usage"]["prompt_tokens_details"] = p["usage"]["prompt_tokens_details"].clone();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correct_split_matches_a_single_engine() {
    let prefill = pod("--engine vllm --role prefill --cached-tokens 5").await;
    let decode = pod("--engine vllm --role decode --cached-tokens 5").await;
    let single = pod("--engine vllm --role decode --allow-recompute --cached-tokens 5").await;
    let client = json!({"prompt": PROMPT, "max_tokens": 4, "echo": true, "logprobs": 2});
    let one = post(&single, COMPLETIONS, &client, &[]).await;
    assert_eq!(one.kv, "recomputed");
    let one = one.json();
    // Prefill with everything; decode without echo (so no prompt logprobs),
    // `logprobs` kept for the generated tokens.
    let (pj, mut d) = nixl_prefill(&prefill, &client).await;
    d.as_object_mut().unwrap().remove("echo");
    let da = post(&decode, COMPLETIONS, &d, &[]).await;
    assert_eq!(da.kv, "pulled", "{}", da.text);
    let merged = merge_echo(&pj, &da.json());
    for key in ["text", "logprobs", "prompt_logprobs"] {
        assert_eq!(merged["choices"][0][key], one["choices"][0][key], "{key}");
    }
    assert_eq!(merged["usage"], one["usage"]);
    assert_eq!(
        *cached(&one["usage"]),
        json!(0),
        "prompt logprobs skip the cache"
    );
}

/// An SGLang pair sent at once; `p`/`d` get the bootstrap fields.
pub(crate) async fn sglang_pair(
    prefill: &Pod,
    decode: &Pod,
    path: &str,
    client: &Value,
    room: u64,
) -> (Answer, Answer) {
    let boot = prefill.bootstrap.expect("bootstrap");
    let mut p = client.clone();
    p["max_tokens"] = json!(1);
    p["stream"] = json!(false);
    if let Some(o) = p.as_object_mut() {
        o.remove("stream_options");
    }
    let mut d = client.clone();
    for leg in [&mut p, &mut d] {
        leg["bootstrap_host"] = json!(boot.ip().to_string());
        leg["bootstrap_port"] = json!(boot.port());
        leg["bootstrap_room"] = json!(room);
    }
    tokio::join!(post(prefill, path, &p, &[]), post(decode, path, &d, &[]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_cached_tokens_travel_in_the_bootstrap() {
    let p_tokens = prompt_tokens();
    let client = json!({"prompt": PROMPT, "max_tokens": 2});
    let prefill =
        pod("--engine sglang --role prefill --cached-tokens 4 --enable-cache-report").await;
    let decode = pod("--engine sglang --role decode --enable-cache-report --cached-tokens 9").await;
    let (pa, da) = sglang_pair(&prefill, &decode, COMPLETIONS, &client, 1).await;
    assert_eq!(*cached(&pa.json()["usage"]), json!(4));
    assert_eq!(da.kv, "pulled", "{}", da.text);
    assert_eq!(*cached(&da.json()["usage"]), json!(4));
    assert!(da.json()["choices"][0].get("prompt_logprobs").is_none());

    // The pre-fix double count.
    let decode2 =
        pod("--engine sglang --role decode --enable-cache-report --double-count-cached").await;
    let (_, da) = sglang_pair(&prefill, &decode2, COMPLETIONS, &client, 2).await;
    assert_eq!(*cached(&da.json()["usage"]), json!(4 + p_tokens));

    // Without --enable-cache-report: null; streamed usage too.
    let decode3 = pod("--engine sglang --role decode").await;
    let mut c = client.clone();
    c["stream"] = json!(true);
    c["stream_options"] = json!({"include_usage": true});
    let (_, da) = sglang_pair(&prefill, &decode3, COMPLETIONS, &c, 3).await;
    let last = da.events().pop().expect("usage");
    assert_eq!(last["usage"]["prompt_tokens_details"], Value::Null);
    assert_eq!(last["usage"]["completion_tokens"], 2);

    // Nothing cached: null even with the flag (SGLang reports only > 0).
    let prefill0 = pod("--engine sglang --role prefill --enable-cache-report").await;
    let (pa, da) = sglang_pair(
        &prefill0,
        &decode,
        CHAT,
        &json!({"messages": [], "max_tokens": 1}),
        4,
    )
    .await;
    assert_eq!(pa.json()["usage"]["prompt_tokens_details"], Value::Null);
    assert_eq!(da.json()["usage"]["prompt_tokens_details"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_echo_logprobs_under_pd() {
    let p_tokens = prompt_tokens();
    let prefill =
        pod("--engine sglang --role prefill --cached-tokens 4 --enable-cache-report").await;
    let decode = pod("--engine sglang --role decode --enable-cache-report").await;
    let client = json!({"prompt": PROMPT, "max_tokens": 2, "echo": true, "logprobs": 1,
                        "prompt_logprobs": 3});
    let (pa, da) = sglang_pair(&prefill, &decode, COMPLETIONS, &client, 7).await;
    let pj = pa.json();
    let pc = &pj["choices"][0];
    assert_eq!(pc["text"], format!("{PROMPT}P"));
    assert_eq!(
        pc["logprobs"]["tokens"].as_array().unwrap().len() as u64,
        p_tokens + 1
    );
    assert_eq!(pc["logprobs"]["text_offset"][0], -1);
    assert!(
        pc.get("prompt_logprobs").is_none(),
        "SGLang has no prompt_logprobs"
    );
    // logprob_start_len 0: no radix hits on the prefill, nor so on the decode.
    assert_eq!(pj["usage"]["prompt_tokens_details"], Value::Null);
    let dj = da.json();
    let dc = &dj["choices"][0];
    assert_eq!(dc["text"], format!("{PROMPT}tok0 tok1"));
    assert_eq!(dc["logprobs"]["tokens"], json!(["tok0", " tok1"]));
    assert_eq!(da.kv, "pulled");
}

/// A TensorRT-LLM chat context asked for base64 ids, and the generation
/// request an orchestrator builds from its answer.
async fn trtllm_b64_pair(context: &Pod) -> (Value, Value) {
    let client =
        json!({"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3});
    let mut ctx = client.clone();
    ctx["max_tokens"] = json!(1);
    ctx["disaggregated_params"] = json!({
        "request_type": "context_only",
        "disagg_request_id": (1u64 << 60) + 7,
        "return_prompt_token_ids_b64": true,
    });
    let c = post(context, CHAT, &ctx, &[]).await;
    assert_eq!(c.status, 200, "{}", c.text);
    let cj = c.json();
    let mut gen = client;
    gen["disaggregated_params"] = cj["choices"][0]["disaggregated_params"].clone();
    gen["disaggregated_params"]["request_type"] = json!("generation_only");
    gen["prompt_token_ids_b64"] = cj["prompt_token_ids_b64"].clone();
    (cj, gen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trtllm_generation_checks_base64_ids() {
    let context = pod("--engine trtllm --role prefill").await;
    let generation = pod("--engine trtllm --role decode").await;
    let (cj, gen) = trtllm_b64_pair(&context).await;
    assert_eq!(cj["prompt_token_ids"], Value::Null, "{cj}");
    assert!(cj["prompt_token_ids_b64"].is_string(), "{cj}");
    let g = post(&generation, CHAT, &gen, &[]).await;
    assert_eq!((g.status, g.kv.as_str()), (200, "pulled"), "{}", g.text);

    // One id changed (the first int32's low byte): the generation says so.
    let (_, mut gen) = trtllm_b64_pair(&context).await;
    let b64 = gen["prompt_token_ids_b64"]
        .as_str()
        .expect("string")
        .to_string();
    let first = if b64.starts_with('A') { 'B' } else { 'A' };
    gen["prompt_token_ids_b64"] = json!(format!("{first}{}", &b64[1..]));
    let g = post(&generation, CHAT, &gen, &[]).await;
    assert_ne!(g.status, 200, "{}", g.text);
    assert!(g.text.contains("differ from the context's"), "{}", g.text);

    // Dropped: TensorRT-LLM would tokenise again, but an orchestrator
    // relays what the context answered.
    let (_, mut gen) = trtllm_b64_pair(&context).await;
    gen.as_object_mut()
        .expect("object")
        .remove("prompt_token_ids_b64");
    let g = post(&generation, CHAT, &gen, &[]).await;
    assert!(
        g.text.contains("as the context answered them"),
        "{}",
        g.text
    );

    // The array where the context answered base64 is refused too.
    let (cj, mut gen) = trtllm_b64_pair(&context).await;
    gen.as_object_mut()
        .expect("object")
        .remove("prompt_token_ids_b64");
    let b64 = cj["prompt_token_ids_b64"].as_str().expect("string");
    let bytes = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .expect("base64")
    };
    let ids: Vec<i32> = bytes
        .chunks_exact(4)
        .map(|w| i32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    gen["prompt_token_ids"] = json!(ids);
    let g = post(&generation, CHAT, &gen, &[]).await;
    assert!(
        g.text.contains("as the context answered them"),
        "{}",
        g.text
    );

    // Completions never take the string (TensorRT-LLM reads it on chat).
    let gen = json!({"model": "m", "prompt": [1], "prompt_token_ids_b64": "AQAAAA==",
        "disaggregated_params": {"request_type": "generation_only", "ctx_request_id": 5,
            "disagg_request_id": 5, "ctx_info_endpoint": "127.0.0.1:1"}});
    let g = post(&generation, COMPLETIONS, &gen, &[]).await;
    assert!(g.text.contains("reads it on chat only"), "{}", g.text);

    // Both forms at once is not what an orchestrator sends.
    let (_, mut gen) = trtllm_b64_pair(&context).await;
    gen["prompt_token_ids"] = json!([1]);
    let g = post(&generation, CHAT, &gen, &[]).await;
    assert!(g.text.contains("both"), "{}", g.text);
}
