//! The shell against a fake Envoy (scripts/wasm-test-runner.py): what a host
//! call Envoy refuses does to a request, inside the target the filter ships
//! as. Only here do unit tests reach the host, through the runner's
//! `pd_test` imports.
#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use super::stats::Stats;
use super::stream::{Stream, StreamCore};
use super::streams::Streams;
use crate::config::Config;
use crate::hostwire::serialize_pairs;
use crate::router::Router;
use proxy_wasm::traits::HttpContext;
use proxy_wasm::types::Action;
use std::rc::Rc;

#[link(wasm_import_module = "pd_test")]
extern "C" {
    /// Opens the fake Envoy with these request headers (serialised).
    fn begin(headers: *const u8, size: usize);
    /// Makes the named ABI call answer `status`.
    fn fail(call: *const u8, size: usize, status: u32);
    /// The status of the local reply sent since `begin`, 0 if none.
    fn reply_status() -> u32;
    /// Copies the local reply's body (up to `cap` bytes); its whole length.
    fn reply_body(out: *mut u8, cap: usize) -> usize;
    fn end();
}

/// A fake Envoy open for one test, closed however the test ends.
struct FakeEnvoy;

impl FakeEnvoy {
    fn open(headers: &[(&str, &str)]) -> FakeEnvoy {
        let wire = serialize_pairs(headers);
        unsafe { begin(wire.as_ptr(), wire.len()) };
        FakeEnvoy
    }

    fn fail(&self, call: &str, status: u32) {
        unsafe { fail(call.as_ptr(), call.len(), status) };
    }

    fn reply(&self) -> (u32, String) {
        let mut body = vec![0u8; 4096];
        let len = unsafe { reply_body(body.as_mut_ptr(), body.len()) };
        body.truncate(len);
        (
            unsafe { reply_status() },
            String::from_utf8_lossy(&body).into_owned(),
        )
    }
}

impl Drop for FakeEnvoy {
    fn drop(&mut self) {
        unsafe { end() };
    }
}

/// A client request that points at an upstream of its own choosing: the
/// filter must remove that header before anything else.
const REQUEST: [(&str, &str); 5] = [
    (":method", "POST"),
    (":path", "/v1/completions"),
    (":authority", "gateway"),
    ("content-length", "40"),
    ("x-envoy-original-dst-host", "10.9.9.9:1"),
];

/// The ABI's BadArgument.
const BAD_ARGUMENT: u32 = 2;

fn stream() -> Stream {
    let config = Config::parse(
        br#"{"models":[{"name":"m","engine":"vllm","rolesets":[
            {"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}]}]}"#,
    )
    .expect("config");
    let router = Rc::new(Router::new(config, 0).expect("router"));
    Stream::new(router, Rc::new(Stats::default()), 1, Rc::default())
}

#[test]
fn the_root_drives_a_live_stream_and_gets_the_answers_of_its_calls() {
    let config = Config::parse(
        br#"{"models":[{"name":"m","engine":"vllm","rolesets":[
            {"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}]}]}"#,
    )
    .expect("config");
    let router = Rc::new(Router::new(config, 0).expect("router"));
    let streams: Rc<Streams<StreamCore>> = Rc::default();
    let stream = Stream::new(router, Rc::new(Stats::default()), 7, Rc::clone(&streams));
    let envoy = FakeEnvoy::open(&REQUEST);
    let mut ran = false;
    streams.drive(7, 1, |_core| {
        // A call the stream makes now is the root's to hand back.
        streams.dispatched(42);
        ran = true;
    });
    assert!(ran);
    streams.dispatched(43);
    assert_eq!(streams.owner_of_call(42), Some(7));
    assert_eq!(streams.owner_of_call(43), None, "made outside a drive");
    assert_eq!(streams.owner_of_call(42), None, "handed back once");

    // Envoy has no such context: nothing runs.
    envoy.fail("proxy_set_effective_context", BAD_ARGUMENT);
    streams.drive(7, 1, |_| panic!("ran without its context"));
    drop(envoy);

    // A stream that ended is gone, its calls with it.
    let envoy = FakeEnvoy::open(&REQUEST);
    streams.drive(7, 1, |_| streams.dispatched(44));
    drop(stream);
    assert_eq!(streams.owner_of_call(44), None);
    streams.drive(7, 1, |_| panic!("drove a stream that ended"));
    drop(envoy);
}

#[test]
fn a_header_write_envoy_refuses_is_a_500_and_the_vm_lives_on() {
    let envoy = FakeEnvoy::open(&REQUEST);
    envoy.fail("proxy_remove_header_map_value", BAD_ARGUMENT);
    assert_eq!(stream().on_http_request_headers(5, false), Action::Pause);
    let (status, body) = envoy.reply();
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("setting a request header failed (BadArgument)"),
        "{body}"
    );
    drop(envoy);

    // Nothing trapped: the same VM takes the next request, whose header
    // write Envoy accepts, and buffers its body.
    let envoy = FakeEnvoy::open(&REQUEST);
    assert_eq!(stream().on_http_request_headers(5, false), Action::Pause);
    assert_eq!(envoy.reply().0, 0, "no local reply");
}

#[test]
fn a_local_reply_envoy_refuses_does_not_trap_either() {
    let envoy = FakeEnvoy::open(&REQUEST);
    envoy.fail("proxy_remove_header_map_value", BAD_ARGUMENT);
    envoy.fail("proxy_send_local_response", BAD_ARGUMENT);
    assert_eq!(stream().on_http_request_headers(5, false), Action::Pause);
    assert_eq!(envoy.reply().0, 0, "the reply was refused");
}
