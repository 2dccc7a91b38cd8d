//! One gateway, many models, over HTTP: the model check and LoRA adapters,
//! `/v1/models`, the request log's `model`, the Messages and token-in
//! APIs split across real prefill/decode pods, and the unsplit calls.

use serde_json::{json, Value};

use crate::pd_tests::{pod, post, recording_pod, sglang_pair, Answer, Pod, PROMPT};
use crate::request::approx_tokens;

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const GENERATE: &str = "/inference/v1/generate";

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}

async fn get(pod: &Pod, path: &str) -> Value {
    client()
        .get(format!("http://{}{path}", pod.http))
        .send()
        .await
        .expect("answer")
        .json()
        .await
        .expect("json")
}

/// A POST of raw bytes with a content type (multipart forms).
async fn post_raw(pod: &Pod, path: &str, content_type: &str, body: Vec<u8>) -> Answer {
    let resp = client()
        .post(format!("http://{}{path}", pod.http))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("answer");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    Answer {
        status,
        kv: String::new(),
        text,
    }
}

fn chat(model: Option<&str>) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_serves_its_model_and_adapters_only() {
    let p = recording_pod(
        "--engine vllm --role decode --allow-recompute --model base --lora ad1 --lora ad2=/w/ad2",
    )
    .await;
    let models = get(&p, "/v1/models").await;
    assert_eq!(models["object"], "list");
    let data = models["data"].as_array().expect("data");
    let ids: Vec<&str> = data.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["base", "ad1", "ad2"]);
    assert_eq!(data[0]["root"], "base");
    assert_eq!(data[0]["parent"], Value::Null);
    assert_eq!(data[0]["owned_by"], "vllm");
    assert!(data[0]["max_model_len"].is_u64());
    assert_eq!(data[1]["parent"], "base");
    assert_eq!(data[1]["root"], "ad1");
    assert_eq!(data[2]["root"], "/w/ad2");
    assert_eq!(data[2]["max_model_len"], Value::Null);
    assert!(data
        .iter()
        .all(|c| c["object"] == "model" && c["created"].is_u64()));

    // Another model: vLLM's 404, no mock prefix.
    let a = post(&p, CHAT, &chat(Some("other")), &[]).await;
    assert_eq!(a.status, 404, "{}", a.text);
    assert_eq!(
        a.json(),
        json!({"error": {"message": "The model `other` does not exist. Valid aliases: base.",
                         "type": "NotFoundError", "param": "model", "code": 404}})
    );
    // An adapter is served, and named in the answer; no model is the base.
    let a = post(&p, CHAT, &chat(Some("ad1")), &[]).await;
    assert_eq!((a.status, a.json()["model"].clone()), (200, json!("ad1")));
    let a = post(&p, CHAT, &chat(None), &[]).await;
    assert_eq!((a.status, a.json()["model"].clone()), (200, json!("base")));
    let a = post(
        &p,
        "/v1/embeddings",
        &json!({"model": "x", "input": "a"}),
        &[],
    )
    .await;
    assert_eq!(a.status, 404);
    let a = post(
        &p,
        "/v1/embeddings",
        &json!({"model": "ad2", "input": "a"}),
        &[],
    )
    .await;
    assert_eq!((a.status, a.json()["model"].clone()), (200, json!("ad2")));

    // The request log says which model each request named.
    let log = get(&p, "/debug/requests").await;
    let named: Vec<Value> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["model"].clone())
        .collect();
    assert_eq!(
        named,
        [
            json!("other"),
            json!("ad1"),
            Value::Null,
            json!("x"),
            json!("ad2")
        ]
    );
    assert_eq!(log[3]["path"], "/v1/embeddings");

    // Without --model every name is served (and answered as the default).
    let any = pod("--engine vllm --role decode --allow-recompute").await;
    let a = post(&any, CHAT, &chat(Some("anything")), &[]).await;
    assert_eq!(
        (a.status, a.json()["model"].clone()),
        (200, json!("mock-model"))
    );
}

fn message_client() -> Value {
    json!({"model": "m", "system": "be brief",
           "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3})
}

fn message_tokens() -> u64 {
    let c = message_client();
    approx_tokens(format!("{}{}", c["system"], c["messages"]).as_bytes())
}

fn message_prefill_leg() -> Value {
    let mut p = message_client();
    p["max_tokens"] = json!(1);
    p["stream"] = json!(false);
    p["kv_transfer_params"] = json!({"do_remote_decode": true});
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_splits_the_messages_api() {
    let prefill = pod("--engine vllm --role prefill --cached-tokens 3 --model m").await;
    let decode = pod("--engine vllm --role decode --model m").await;
    let p_tokens = message_tokens();
    let pa = post(&prefill, MESSAGES, &message_prefill_leg(), &[]).await;
    assert_eq!(pa.status, 200, "{}", pa.text);
    let pj = pa.json();
    assert_eq!(pj["type"], "message");
    assert!(pj["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(pj["content"], json!([{"type": "text", "text": "P"}]));
    assert_eq!(pj["stop_reason"], "max_tokens");
    assert!(pj.get("stop_sequence").is_none(), "vLLM drops nulls: {pj}");
    assert_eq!(
        pj["usage"],
        json!({"input_tokens": p_tokens - 3, "output_tokens": 1, "cache_read_input_tokens": 3})
    );
    assert_eq!(pj["kv_transfer_params"]["remote_prefill_cached_tokens"], 3);

    let mut d = message_client();
    d["kv_transfer_params"] = pj["kv_transfer_params"].clone();
    let da = post(&decode, MESSAGES, &d, &[]).await;
    assert_eq!((da.status, da.kv.as_str()), (200, "pulled"), "{}", da.text);
    let dj = da.json();
    assert_eq!(dj["content"][0]["text"], "tok0 tok1 tok2");
    assert_eq!(
        dj["usage"],
        json!({"input_tokens": p_tokens - 3, "output_tokens": 3, "cache_read_input_tokens": 3})
    );
    assert!(dj.get("kv_transfer_params").is_none());

    // Streamed: Anthropic's events, usage on message_delta.
    let pj = post(&prefill, MESSAGES, &message_prefill_leg(), &[])
        .await
        .json();
    d["kv_transfer_params"] = pj["kv_transfer_params"].clone();
    d["stream"] = json!(true);
    let da = post(&decode, MESSAGES, &d, &[]).await;
    assert_eq!(da.kv, "pulled", "{}", da.text);
    assert!(da.text.starts_with("event: message_start\ndata: "));
    let ev = da.events();
    let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"message_start"));
    assert_eq!(kinds.last(), Some(&"message_stop"));
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "content_block_delta")
            .count(),
        3
    );
    let delta = &ev[ev.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["cache_read_input_tokens"], 3);
    assert_eq!(delta["usage"]["output_tokens"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_messages_contract_breaks_are_named() {
    let prefill = pod("--engine vllm --role prefill --model m").await;
    let decode = pod("--engine vllm --role decode --model m").await;
    let refused = |a: &Answer, status: u16, kind: &str, says: &str| {
        assert_eq!(a.status, status, "{}", a.text);
        let j = a.json();
        assert_eq!(j["type"], "error", "Anthropic's shape: {j}");
        assert_eq!(j["error"]["type"], kind, "{j}");
        let message = j["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    };
    let mut p = message_prefill_leg();
    p["max_tokens"] = json!(1024);
    let a = post(&prefill, MESSAGES, &p, &[]).await;
    refused(
        &a,
        422,
        "mock_contract_violation",
        "prefill needs `max_tokens` == 1, got 1024",
    );
    let mut p = message_prefill_leg();
    p["min_tokens"] = json!(1);
    let a = post(&prefill, MESSAGES, &p, &[]).await;
    refused(
        &a,
        422,
        "mock_contract_violation",
        "must not carry `min_tokens`",
    );
    let mut p = message_prefill_leg();
    p.as_object_mut().unwrap().remove("kv_transfer_params");
    let a = post(&prefill, MESSAGES, &p, &[]).await;
    refused(
        &a,
        422,
        "mock_contract_violation",
        "no `kv_transfer_params`",
    );
    let a = post(&decode, MESSAGES, &message_client(), &[]).await;
    refused(&a, 422, "mock_contract_violation", "silently recompute");
    // A decode for another prompt than the prefill's.
    let pj = post(&prefill, MESSAGES, &message_prefill_leg(), &[])
        .await
        .json();
    let mut d = message_client();
    d["system"] = json!("be long");
    d["kv_transfer_params"] = pj["kv_transfer_params"].clone();
    let a = post(&decode, MESSAGES, &d, &[]).await;
    refused(&a, 422, "mock_contract_violation", "prompt differs");
    let mut d = message_client();
    d.as_object_mut().unwrap().remove("max_tokens");
    let a = post(&decode, MESSAGES, &d, &[]).await;
    refused(&a, 422, "mock_contract_violation", "no `max_tokens`");
    let mut d = message_client();
    d["model"] = json!("other");
    let a = post(&decode, MESSAGES, &d, &[]).await;
    refused(
        &a,
        404,
        "not_found_error",
        "The model `other` does not exist",
    );

    // Faults keep the path's shape: a status, and a failed stream.
    let faulty = pod("--engine vllm --role decode --model m --fault status:503").await;
    let a = post(&faulty, MESSAGES, &message_client(), &[]).await;
    refused(&a, 503, "mock_fault", "mock fault: status 503");
    let failing = pod("--engine vllm --role decode --model m --fault error-event").await;
    let mut d = message_client();
    d["stream"] = json!(true);
    let a = post(&failing, MESSAGES, &d, &[]).await;
    assert_eq!(a.status, 200);
    assert!(a.text.starts_with("event: error\ndata: "), "{}", a.text);
    assert_eq!(a.events()[0]["error"]["type"], "api_error");
    assert!(!a.text.contains("[DONE]"));
}

fn generate_client() -> Value {
    json!({"model": "m", "token_ids": [11, 12, 13, 14, 15],
           "sampling_params": {"max_tokens": 3, "temperature": 0}})
}

fn generate_prefill_leg() -> Value {
    let mut p = generate_client();
    p["sampling_params"]["max_tokens"] = json!(1);
    p["stream"] = json!(false);
    p["kv_transfer_params"] = json!({"do_remote_decode": true});
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_splits_the_token_in_api() {
    let prefill = pod("--engine vllm --role prefill --cached-tokens 2 --model m").await;
    let decode = pod("--engine vllm --role decode --model m").await;
    let pa = post(
        &prefill,
        GENERATE,
        &generate_prefill_leg(),
        &[("x-request-id", "r1")],
    )
    .await;
    assert_eq!(pa.status, 200, "{}", pa.text);
    let pj = pa.json();
    assert_eq!(pj["request_id"], "generate-tokens-r1");
    assert_eq!(pj["output_mode"], "tokens");
    assert_eq!(pj["choices"][0]["token_ids"], json!([47]));
    assert_eq!(pj["choices"][0]["finish_reason"], "length");
    assert_eq!(
        pj["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6,
               "prompt_tokens_details": {"cached_tokens": 2}})
    );
    assert_eq!(pj["kv_transfer_params"]["do_remote_prefill"], true);

    let mut d = generate_client();
    d["kv_transfer_params"] = pj["kv_transfer_params"].clone();
    let da = post(&decode, GENERATE, &d, &[]).await;
    assert_eq!((da.status, da.kv.as_str()), (200, "pulled"), "{}", da.text);
    let dj = da.json();
    assert_eq!(
        dj["choices"][0]["token_ids"],
        json!([100000, 100001, 100002])
    );
    assert_eq!(dj["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
    assert_eq!(dj["kv_transfer_params"], Value::Null);
    assert_eq!(dj["model"], "m");

    // Streamed with usage: token chunks, the usage chunk, [DONE].
    let pj = post(&prefill, GENERATE, &generate_prefill_leg(), &[])
        .await
        .json();
    d["kv_transfer_params"] = pj["kv_transfer_params"].clone();
    d["stream"] = json!(true);
    d["stream_options"] = json!({"include_usage": true});
    let da = post(&decode, GENERATE, &d, &[]).await;
    assert_eq!(da.kv, "pulled", "{}", da.text);
    assert!(da.text.ends_with("data: [DONE]\n\n"));
    let ev = da.events();
    assert_eq!(ev.len(), 4);
    assert_eq!(ev[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(ev[3]["usage"]["completion_tokens"], 3);
    assert_eq!(ev[3]["choices"], json!([]));

    // The prefill contract lives in sampling_params.
    let mut p = generate_prefill_leg();
    p["sampling_params"]["min_tokens"] = json!(1);
    let a = post(&prefill, GENERATE, &p, &[]).await;
    assert_eq!(a.status, 422, "{}", a.text);
    assert!(a
        .text
        .contains("must not carry `sampling_params.min_tokens`"));
    let mut p = generate_prefill_leg();
    p["sampling_params"]["max_tokens"] = json!(3);
    p["max_tokens"] = json!(1);
    let a = post(&prefill, GENERATE, &p, &[]).await;
    assert!(a
        .text
        .contains("prefill needs `sampling_params.max_tokens` == 1, got 3"));
    // Other ids than the prefill's.
    let pj = post(&prefill, GENERATE, &generate_prefill_leg(), &[])
        .await
        .json();
    let mut d = generate_client();
    d["token_ids"] = json!([11, 12, 13, 14]);
    d["kv_transfer_params"] = pj["kv_transfer_params"].clone();
    let a = post(&decode, GENERATE, &d, &[]).await;
    assert!(a.text.contains("prompt differs"), "{}", a.text);
    let a = post(
        &decode,
        GENERATE,
        &json!({"token_ids": [], "sampling_params": {}}),
        &[],
    )
    .await;
    assert!(
        a.text.contains("`token_ids` must be a non-empty array"),
        "{}",
        a.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_splits_messages_by_room_and_serves_no_generate() {
    let prefill = pod("--engine sglang --role prefill --model m").await;
    let decode = pod("--engine sglang --role decode --model m").await;
    let (pa, da) = sglang_pair(&prefill, &decode, MESSAGES, &message_client(), 9).await;
    assert_eq!(pa.status, 200, "{}", pa.text);
    assert_eq!((da.status, da.kv.as_str()), (200, "pulled"), "{}", da.text);
    let dj = da.json();
    assert!(dj["id"].as_str().unwrap().starts_with("msg_"), "{dj}");
    assert_eq!(dj["content"][0]["text"], "tok0 tok1 tok2");
    assert_eq!(
        dj["usage"],
        json!({"input_tokens": message_tokens(), "output_tokens": 3})
    );
    let a = post(&decode, GENERATE, &generate_client(), &[]).await;
    assert_eq!(a.status, 404, "{}", a.text);
    let trt = pod("--engine trtllm --role decode").await;
    let a = post(&trt, MESSAGES, &message_client(), &[]).await;
    assert_eq!(a.status, 404, "{}", a.text);
    let a = post(&decode, "/v1/embeddings", &json!({"input": "a"}), &[]).await;
    assert_eq!(a.status, 404, "{}", a.text);
}

fn form(boundary: &str, model: Option<&str>) -> Vec<u8> {
    let mut body = String::new();
    if let Some(m) = model {
        body.push_str(&format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{m}\r\n"
        ));
    }
    body.push_str(&format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\
         Content-Type: audio/wav\r\n\r\nRIFF1234\r\n--{boundary}--\r\n"
    ));
    body.into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsplit_calls_answer_as_vllm() {
    let p = recording_pod("--engine vllm --role decode --model m --lora ad").await;
    let ok = |a: &Answer| {
        assert_eq!(a.status, 200, "{}", a.text);
        a.json()
    };
    let t = ok(&post(
        &p,
        "/tokenize",
        &json!({"model": "m", "prompt": "Hello world"}),
        &[],
    )
    .await);
    assert_eq!(t["count"], 4);
    let d = ok(&post(&p, "/detokenize", &json!({"tokens": [5]}), &[]).await);
    assert_eq!(d["prompt"], "<t5>");
    for path in ["/score", "/v1/score"] {
        let s = ok(&post(
            &p,
            path,
            &json!({"model": "ad", "queries": "q",
                                             "documents": ["a", "b"]}),
            &[],
        )
        .await);
        assert_eq!(
            (s["model"].clone(), s["data"].as_array().unwrap().len()),
            (json!("ad"), 2)
        );
    }
    for path in ["/rerank", "/v1/rerank"] {
        let r = ok(&post(
            &p,
            path,
            &json!({"query": "q", "documents": ["a", "b"]}),
            &[],
        )
        .await);
        assert_eq!(r["results"].as_array().unwrap().len(), 2);
    }
    let pl = ok(&post(&p, "/pooling", &json!({"input": "x"}), &[]).await);
    assert_eq!(pl["data"][0]["object"], "pooling");
    let c = ok(&post(&p, "/classify", &json!({"input": "x"}), &[]).await);
    assert_eq!(c["data"][0]["num_classes"], 2);
    let n = ok(&post(&p, "/v1/messages/count_tokens", &message_client(), &[]).await);
    assert_eq!(n["input_tokens"], message_tokens());
    let e = ok(&post(
        &p,
        "/v1/embeddings",
        &json!({"input": ["a"], "encoding_format": "base64"}),
        &[],
    )
    .await);
    assert!(e["data"][0]["embedding"].is_string());
    for path in ["/tokenize", "/score", "/rerank", "/pooling", "/classify"] {
        let a = post(&p, path, &json!({"model": "nope"}), &[]).await;
        assert_eq!(a.status, 404, "{path}: {}", a.text);
    }
    let a = post(
        &p,
        "/v1/messages/count_tokens",
        &json!({"model": "nope", "messages": []}),
        &[],
    )
    .await;
    assert_eq!(
        (a.status, a.json()["error"]["type"].clone()),
        (404, json!("not_found_error"))
    );

    // Audio: a multipart form, `model` optional.
    let ct = "multipart/form-data; boundary=xyz";
    for (model, status, says) in [
        (Some("ad"), 200, "by ad"),
        (None, 200, "by m"),
        (Some("nope"), 404, "does not exist"),
    ] {
        for path in ["/v1/audio/transcriptions", "/v1/audio/translations"] {
            let a = post_raw(&p, path, ct, form("xyz", model)).await;
            assert_eq!(a.status, status, "{path}: {}", a.text);
            assert!(a.text.contains(says), "{}", a.text);
        }
    }
    let a = post_raw(
        &p,
        "/v1/audio/transcriptions",
        "application/json",
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.text);
    let log = get(&p, "/debug/requests").await;
    let audio: Vec<Value> = log
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["path"] == "/v1/audio/transcriptions")
        .map(|r| r["model"].clone())
        .collect();
    assert_eq!(
        audio,
        [json!("ad"), Value::Null, json!("nope"), Value::Null]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nixl_push_pairs_the_new_apis_by_request_id() {
    let prefill = pod("--engine vllm --role prefill --connector nixl_push --engine-id p0").await;
    let decode = pod("--engine vllm --role decode --connector nixl_push").await;
    // Token-in: header X-Request-Id (else body request_id), internal
    // `generate-tokens-{id}`.
    let mut p = generate_prefill_leg();
    p["request_id"] = json!("g1");
    let pj = post(&prefill, GENERATE, &p, &[]).await.json();
    let params = &pj["kv_transfer_params"];
    assert_eq!(params["remote_request_id"], "generate-tokens-g1", "{pj}");
    let mut d = generate_client();
    d["kv_transfer_params"] = json!({"do_remote_prefill": true, "remote_engine_id": "p0",
        "remote_host": params["remote_host"], "remote_port": params["remote_port"],
        "tp_size": 1});
    let da = post(&decode, GENERATE, &d, &[("x-request-id", "g1")]).await;
    assert_eq!((da.status, da.kv.as_str()), (200, "pulled"), "{}", da.text);

    // Messages: the header only (vLLM serves them as chat, without the
    // body's id), internal `chatcmpl-{id}`.
    let mut p = message_prefill_leg();
    p["request_id"] = json!("m1");
    let a = post(&prefill, MESSAGES, &p, &[]).await;
    assert_eq!(a.status, 422, "{}", a.text);
    assert!(
        a.text.contains("/v1/messages ignores a body `request_id`"),
        "{}",
        a.text
    );
    let pj = post(&prefill, MESSAGES, &p, &[("x-request-id", "m1")])
        .await
        .json();
    assert_eq!(pj["kv_transfer_params"]["remote_request_id"], "chatcmpl-m1");
    let mut d = message_client();
    d["kv_transfer_params"] = json!({"do_remote_prefill": true, "remote_engine_id": "p0",
        "remote_host": params["remote_host"], "remote_port": params["remote_port"],
        "tp_size": 1});
    let da = post(&decode, MESSAGES, &d, &[("x-request-id", "m1")]).await;
    assert_eq!((da.status, da.kv.as_str()), (200, "pulled"), "{}", da.text);
}
