//! vLLM E/P/D in one process: encoder pods and a prefill that consumes
//! their output, over HTTP, with either EC connector.

use serde_json::{json, Value};

use crate::pd_tests::{pod, post};

const CHAT: &str = "/v1/chat/completions";

fn image(name: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": format!("https://x/{name}.png")}})
}

/// The encoder request for one item, as the router builds it.
fn encoder_leg(item: Value) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": [item]}],
           "max_tokens": 1, "stream": false})
}

/// A prefill leg whose request holds `items` (and text).
fn prefill_leg(items: &[Value], ec: Option<Value>) -> Value {
    let mut content = vec![json!({"type": "text", "text": "compare"})];
    content.extend(items.iter().cloned());
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": content}],
        "max_tokens": 1, "stream": false,
        "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false}});
    if let Some(ec) = ec {
        body["ec_transfer_params"] = ec;
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nixl_a_prefill_pulls_each_item_from_the_encoder_its_params_name() {
    let enc = pod("--engine vllm --role encode --ec-connector nixl").await;
    let prefill = pod("--engine vllm --role prefill --ec-connector nixl").await;
    let (cat, dog) = (image("cat"), image("dog"));
    let a = post(&enc, CHAT, &encoder_leg(cat.clone()), &[]).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let params = a.json()["ec_transfer_params"].clone();
    let cat_hash = params
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .expect("one entry");
    assert_eq!(params[&cat_hash]["do_remote_encode"], true);
    // The dog was never encoded: its entry is missing.
    let only_cat = post(
        &prefill,
        CHAT,
        &prefill_leg(&[cat.clone(), dog.clone()], Some(params.clone())),
        &[],
    )
    .await;
    assert_eq!(only_cat.status, 422, "{}", only_cat.text);
    assert!(
        only_cat.text.contains("was not encoded"),
        "{}",
        only_cat.text
    );
    let b = post(&enc, CHAT, &encoder_leg(dog.clone()), &[]).await;
    let mut merged = params.as_object().cloned().expect("map");
    merged.extend(
        b.json()["ec_transfer_params"]
            .as_object()
            .cloned()
            .expect("map"),
    );
    let both = post(
        &prefill,
        CHAT,
        &prefill_leg(&[cat.clone(), dog], Some(Value::Object(merged.clone()))),
        &[],
    )
    .await;
    assert_eq!(both.status, 200, "{}", both.text);
    // An entry naming an item of another request is the router's mistake.
    let stray = post(
        &prefill,
        CHAT,
        &prefill_leg(&[cat], Some(Value::Object(merged))),
        &[],
    )
    .await;
    assert_eq!(stray.status, 422, "{}", stray.text);
    // Text alone needs no encoder.
    let text = post(&prefill, CHAT, &prefill_leg(&[], None), &[]).await;
    assert_eq!(text.status, 200, "{}", text.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_a_prefill_finds_each_item_in_the_shared_storage() {
    let dir = std::env::temp_dir().join(format!(
        "mock-ec-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let storage = dir.display().to_string();
    let enc = pod(&format!(
        "--engine vllm --role encode --ec-storage {storage}"
    ))
    .await;
    let prefill = pod(&format!(
        "--engine vllm --role prefill --ec-connector example --ec-storage {storage}"
    ))
    .await;
    let cat = image("cat");
    let before = post(
        &prefill,
        CHAT,
        &prefill_leg(std::slice::from_ref(&cat), None),
        &[],
    )
    .await;
    assert_eq!(before.status, 422, "{}", before.text);
    let a = post(&enc, CHAT, &encoder_leg(cat.clone()), &[]).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json()["ec_transfer_params"], Value::Null);
    let after = post(&prefill, CHAT, &prefill_leg(&[cat], None), &[]).await;
    assert_eq!(after.status, 200, "{}", after.text);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoder_takes_one_item_one_token_unstreamed() {
    let enc = pod("--engine vllm --role encode --ec-connector nixl").await;
    let (cat, dog) = (image("cat"), image("dog"));
    let mut two = encoder_leg(cat.clone());
    two["messages"][0]["content"] = json!([cat.clone(), dog]);
    let mut text = encoder_leg(cat.clone());
    text["messages"][0]["content"] = json!([{"type": "text", "text": "hi"}]);
    let mut long = encoder_leg(cat.clone());
    long["max_tokens"] = json!(5);
    let mut streamed = encoder_leg(cat.clone());
    streamed["stream"] = json!(true);
    let mut completion = encoder_leg(cat);
    completion.as_object_mut().map(|o| o.remove("max_tokens"));
    completion["max_completion_tokens"] = json!(1);
    for (body, ok) in [
        (two, false),
        (text, false),
        (long, false),
        (streamed, false),
        (completion, true),
    ] {
        let a = post(&enc, CHAT, &body, &[]).await;
        assert_eq!(a.status == 200, ok, "{body}: {}", a.text);
    }
}
