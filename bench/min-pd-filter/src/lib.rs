//! A minimal prefill/decode filter: the floor for any proxy-wasm PD router on
//! Envoy. Per request: pause at the headers, buffer the body, send it
//! unchanged to the prefill pod (`dispatch_http_call`), and when that answers
//! point the request at the decode pod, set its body (the same bytes) and
//! resume. Configuration: `{"prefill":"IP:PORT","decode":"IP:PORT"}`.
//!
//! `"steps"` adds pd-router's work one piece at a time, to bisect the gap
//! between this floor and pd-router (bench/README.md): `json` validates the
//! request body and the prefill's answer with serde_json; `json,edit` also
//! sends new bodies, as an engine's hand-off does: the prefill's with two
//! members appended, the decode's with the prefill's answer appended.
//! `vllm` is the least a vLLM (NIXL) PD filter must do, for the vLLM
//! mocks: `kv_transfer_params` with `do_remote_decode` on the prefill, and
//! the prefill answer's `kv_transfer_params` (found by parsing the answer)
//! on the decode. `trtllm` is the least a TensorRT-LLM filter must do, for
//! the TensorRT-LLM mocks (chat, the ids as an array): `disaggregated_params`
//! with `context_only` and a fresh `disagg_request_id` on the context request;
//! on the generation request the answer's `disaggregated_params` with
//! `generation_only`, and its `prompt_token_ids` relayed as bytes, found by
//! a byte search and never read (the answer's last member, as TensorRT-LLM
//! and the mock order it). Its context mock is lenient about `max_tokens`,
//! as min-pd's are, so the client's body goes out with the members appended.
//! `sglang` is the least an SGLang PD filter must do, for the SGLang mocks
//! (configuration `"bootstrap_port"`, the prefill's bootstrap server):
//! `bootstrap_host`, `bootstrap_port` and a fresh `bootstrap_room` on both
//! legs, sent at once as SGLang's legs are: the prefill's body with them
//! appended, the decode's by replacing the body's opening `{` in Envoy's
//! buffer (the rest of it never leaves Envoy), and the decode resumed without
//! waiting for the prefill's answer.
//! `KIND*N` (e.g. `clock*100`) makes N extra host calls of one kind per
//! request, at the body: what one call of that kind costs Envoy and V8, read
//! as (CPU per request - min-pd's) / N. Kinds: `clock` (the time), `get` and
//! `set` (a 56-byte shared-data record, as pd-router's load table), `counter`
//! and `histogram` (one stat update), `header` (a request header written),
//! `headers` (the request header map read whole), `headermap` (the request
//! header map written whole in one call, as a filter batching its header
//! writes would: the map read once per request, then written back N times
//! with one header added).
//! Three kinds measure the cache footprint instead of a host call:
//! `code*N` runs N KiB of distinct code per request (16·N of the 64-byte
//! functions `build.rs` generates, called in a scattered order), `hotcode*N`
//! the first of those KiB N times (the same instructions, no footprint), and
//! `data*N` reads one byte of each 64-byte line of N KiB of the filter's
//! memory, scattered (N at most 256): what a KiB of a request's code or data
//! costs when Envoy's own work between two callbacks evicts it, read as
//! (CPU per request - min-pd's) / N. The generated functions are in every
//! build; without these steps nothing calls them.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType, MetricType};
use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

const ROUTE: &str = "x-envoy-original-dst-host";

include!(concat!(env!("OUT_DIR"), "/code_blocks.rs"));

/// The memory `data*N` reads: 256 KiB, allocated at configuration.
const DATA_KIB: usize = 256;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

#[derive(Default, Clone)]
struct Steps {
    json: bool,
    edit: bool,
    vllm: bool,
    trtllm: bool,
    sglang: bool,
    calls: Vec<(Call, u32)>,
    data: Vec<u8>,
}

#[derive(Clone, Copy)]
enum Call {
    Clock,
    Get,
    Set,
    Counter,
    Histogram,
    Header,
    Headers,
    HeaderMap,
    Code,
    HotCode,
    Data,
}

impl Call {
    fn of(name: &str) -> Option<Call> {
        Some(match name {
            "clock" => Call::Clock,
            "get" => Call::Get,
            "set" => Call::Set,
            "counter" => Call::Counter,
            "histogram" => Call::Histogram,
            "header" => Call::Header,
            "headers" => Call::Headers,
            "headermap" => Call::HeaderMap,
            "code" => Call::Code,
            "hotcode" => Call::HotCode,
            "data" => Call::Data,
            _ => return None,
        })
    }
}

const SHARED_KEY: &str = "min_pd.record";

#[derive(Default)]
struct Root {
    pods: Rc<(String, String)>,
    /// The SGLang prefill's bootstrap port (`sglang` steps).
    bootstrap_port: Rc<str>,
    steps: Rc<Steps>,
    metrics: Rc<(u32, u32)>,
    /// The next TensorRT-LLM `disagg_request_id` (the mock wants them from 2^42 and unique).
    next_id: Rc<Cell<u64>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let raw = self.get_plugin_configuration().unwrap_or_default();
        let Ok(mut cfg) = serde_json::from_slice::<HashMap<String, String>>(&raw) else {
            return false;
        };
        match (cfg.remove("prefill"), cfg.remove("decode")) {
            (Some(p), Some(d)) => self.pods = Rc::new((p, d)),
            _ => return false,
        }
        let steps = cfg.remove("steps").unwrap_or_default();
        let has = |s: &str| steps.split(',').any(|x| x == s);
        let mut calls = Vec::new();
        for item in steps.split(',').filter(|x| x.contains('*')) {
            let (kind, n) = item.split_once('*').unwrap_or_default();
            match (Call::of(kind), n.parse::<u32>()) {
                (Some(Call::Code | Call::HotCode | Call::Data), Ok(n)) if n as usize > DATA_KIB => {
                    return false
                }
                (Some(c), Ok(n)) => calls.push((c, n)),
                _ => return false,
            }
        }
        if !calls.is_empty() {
            let define = |t, name| proxy_wasm::hostcalls::define_metric(t, name).unwrap_or(0);
            self.metrics = Rc::new((
                define(MetricType::Counter, "min_pd.calls"),
                define(MetricType::Histogram, "min_pd.values"),
            ));
            let _ = self.set_shared_data(SHARED_KEY, Some(&[7u8; 56]), None);
        }
        let data = if calls.iter().any(|(c, _)| matches!(c, Call::Data)) {
            (0..DATA_KIB * 1024)
                .map(|i| (i * 131 % 251) as u8)
                .collect()
        } else {
            Vec::new()
        };
        self.steps = Rc::new(Steps {
            json: has("json") || has("edit"),
            edit: has("edit"),
            vllm: has("vllm"),
            trtllm: has("trtllm"),
            sglang: has("sglang"),
            calls,
            data,
        });
        if self.steps.sglang {
            match cfg.remove("bootstrap_port") {
                Some(p) if p.parse::<u16>().is_ok() => self.bootstrap_port = p.into(),
                _ => return false,
            }
        }
        if self.steps.trtllm || self.steps.sglang {
            // Unique across restarts of this Envoy against the same mocks.
            let now = self
                .get_current_time()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or(0);
            self.next_id = Rc::new(Cell::new((1 << 42) + (now & ((1 << 40) - 1)) * 1024));
        }
        true
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream {
            pods: self.pods.clone(),
            bootstrap_port: self.bootstrap_port.clone(),
            steps: self.steps.clone(),
            metrics: self.metrics.clone(),
            next_id: self.next_id.clone(),
            body: Vec::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Stream {
    pods: Rc<(String, String)>,
    bootstrap_port: Rc<str>,
    steps: Rc<Steps>,
    metrics: Rc<(u32, u32)>,
    next_id: Rc<Cell<u64>>,
    body: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The generation request's members from a TensorRT-LLM context answer:
/// its `disaggregated_params` (the first choice's) turned `generation_only`,
/// and its `prompt_token_ids` array as bytes, taken to the answer's last `]`.
fn trtllm_handoff(answer: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    const PARAMS: &[u8] = br#""disaggregated_params":"#;
    const IDS: &[u8] = br#""prompt_token_ids":["#;
    let at = find(answer, PARAMS)? + PARAMS.len();
    let mut values = serde_json::Deserializer::from_slice(answer.get(at..)?)
        .into_iter::<serde::de::IgnoredAny>();
    values.next()?.ok()?;
    let params = answer.get(at..at + values.byte_offset())?;
    let kind = find(params, br#""context_only""#)?;
    let mut generation = Vec::with_capacity(params.len() + 3);
    generation.extend_from_slice(&params[..kind]);
    generation.extend_from_slice(br#""generation_only""#);
    generation.extend_from_slice(&params[kind + br#""context_only""#.len()..]);
    let start = find(answer, IDS)? + IDS.len() - 1;
    let end = answer.iter().rposition(|b| *b == b']')? + 1;
    (end > start).then(|| (generation, &answer[start..end]))
}

fn valid_json(b: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok()
}

/// `object` with `members` (`,"k":v...`) appended before its closing brace.
fn appended(object: &[u8], members: &[&[u8]]) -> Vec<u8> {
    let close = object
        .iter()
        .rposition(|b| *b == b'}')
        .unwrap_or(object.len());
    let mut out = Vec::with_capacity(object.len() + members.iter().map(|m| m.len()).sum::<usize>());
    out.extend_from_slice(&object[..close]);
    for m in members {
        out.extend_from_slice(m);
    }
    out.extend_from_slice(&object[close..]);
    out
}

impl Stream {
    /// The extra host calls of `KIND*N` steps; what they return is dropped
    /// (black-boxed so the calls stay).
    fn extra_calls(&mut self) {
        use proxy_wasm::hostcalls as h;
        let mut header_map = Vec::new();
        if self
            .steps
            .calls
            .iter()
            .any(|(c, _)| matches!(c, Call::HeaderMap))
        {
            header_map = h::get_map(MapType::HttpRequestHeaders).unwrap_or_default();
            header_map.push(("x-min-pd".to_string(), "1".to_string()));
        }
        for (call, n) in self.steps.calls.iter() {
            for i in 0..*n {
                match call {
                    Call::Clock => {
                        std::hint::black_box(h::get_current_time().ok());
                    }
                    Call::Get => {
                        std::hint::black_box(h::get_shared_data(SHARED_KEY).ok());
                    }
                    Call::Set => {
                        std::hint::black_box(
                            h::set_shared_data(SHARED_KEY, Some(&[i as u8; 56]), None).ok(),
                        );
                    }
                    Call::Counter => {
                        std::hint::black_box(h::increment_metric(self.metrics.0, 1).ok());
                    }
                    Call::Histogram => {
                        std::hint::black_box(h::record_metric(self.metrics.1, u64::from(i)).ok());
                    }
                    Call::Header => {
                        std::hint::black_box(
                            h::set_map_value(MapType::HttpRequestHeaders, "x-min-pd", Some("1"))
                                .ok(),
                        );
                    }
                    Call::Headers => {
                        std::hint::black_box(h::get_map_bytes(MapType::HttpRequestHeaders).ok());
                    }
                    Call::HeaderMap => {
                        let pairs = header_map.iter().map(|(k, v)| (k.as_str(), v.as_str()));
                        std::hint::black_box(
                            h::set_map(MapType::HttpRequestHeaders, pairs.collect()).ok(),
                        );
                    }
                    Call::Code | Call::HotCode => {
                        // `hotcode`: the same instructions, the same first
                        // KiB every time: what `code` costs without its
                        // footprint.
                        let kib = if matches!(call, Call::Code) {
                            i as usize
                        } else {
                            0
                        };
                        let mut x = u64::from(i);
                        for f in &BLOCKS[kib * 16..][..16] {
                            x = f(std::hint::black_box(x));
                        }
                        std::hint::black_box(x);
                    }
                    Call::Data => {
                        // The 16 lines of one KiB out of the N, scattered
                        // over them as `code`'s calls are (no stream for the
                        // prefetcher to follow).
                        let lines = *n as usize * 16;
                        let data = &self.steps.data;
                        let sum = (0..16).fold(0u8, |a, k| {
                            let line = (i as usize * 16 + k) * 1237 % lines;
                            a.wrapping_add(data[line * 64])
                        });
                        std::hint::black_box(sum);
                    }
                }
            }
        }
    }

    /// SGLang's decode leg, sent with the prefill: the body's `{` in
    /// Envoy's buffer replaced by `{` and the bootstrap members.
    fn send_sglang_decode(&mut self, front: &str) -> Action {
        if self.body.first() != Some(&b'{') {
            return self.fail("the body does not start with {");
        }
        let len = self.body.len() - 1 + front.len();
        self.set_http_request_body(0, 1, front.as_bytes());
        self.set_http_request_header("content-length", Some(&len.to_string()));
        self.set_http_request_header(ROUTE, Some(self.pods.1.as_str()));
        self.body = Vec::new();
        Action::Continue
    }

    fn fail(&self, why: &str) -> Action {
        let body = format!("min-pd: {why}");
        self.send_http_response(502, vec![], Some(body.as_bytes()));
        Action::Pause
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        // Paused: the header map stays writable until the decode pod is set.
        if end_of_stream {
            self.fail("empty request")
        } else {
            Action::Pause
        }
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause; // Envoy buffers until the end of the stream
        }
        self.extra_calls();
        self.body = self.get_http_request_body(0, size).unwrap_or_default();
        if self.steps.json && !valid_json(&self.body) {
            return self.fail("the body is not JSON");
        }
        // `sglang`: the decode body's new front, sent with the prefill.
        let mut sglang_front = None;
        // `None`: the client's body goes to the prefill unchanged.
        let prefill = if self.steps.vllm {
            Some(appended(
                &self.body,
                &[br#","kv_transfer_params":{"do_remote_decode":true}"#],
            ))
        } else if self.steps.trtllm {
            let id = self.next_id.get();
            self.next_id.set(id + 1);
            let params = format!(
                r#","disaggregated_params":{{"request_type":"context_only","disagg_request_id":{id}}}"#
            );
            Some(appended(&self.body, &[params.as_bytes()]))
        } else if self.steps.sglang {
            let room = self.next_id.get();
            self.next_id.set(room + 1);
            let host = self.pods.0.rsplit_once(':').map_or("", |(h, _)| h);
            let port = &self.bootstrap_port;
            let members = format!(
                r#","bootstrap_host":"{host}","bootstrap_port":{port},"bootstrap_room":{room}"#
            );
            sglang_front = Some(format!("{{{},", &members[1..]));
            Some(appended(&self.body, &[members.as_bytes()]))
        } else if self.steps.edit {
            Some(appended(&self.body, &[br#","user":"min-pd","seed":1"#]))
        } else {
            None
        };
        let prefill_body = prefill.as_deref().unwrap_or(&self.body);
        let path = self.get_http_request_header(":path").unwrap_or_default();
        let authority = self
            .get_http_request_header(":authority")
            .unwrap_or_default();
        let headers = vec![
            (":method", "POST"),
            (":path", path.as_str()),
            (":authority", authority.as_str()),
            ("content-type", "application/json"),
            (ROUTE, self.pods.0.as_str()),
        ];
        match self.dispatch_http_call(
            "pd_prefill",
            headers,
            Some(prefill_body),
            vec![],
            Duration::from_secs(30),
        ) {
            Ok(_) => match sglang_front {
                Some(front) => self.send_sglang_decode(&front),
                None => Action::Pause,
            },
            Err(e) => self.fail(&format!("dispatch_http_call: {e:?}")),
        }
    }
}

impl Context for Stream {
    fn on_http_call_response(&mut self, _token: u32, n: usize, size: usize, _trailers: usize) {
        if self.steps.sglang {
            // The decode left with the prefill; its answer is the client's.
            return;
        }
        let status = self.get_http_call_response_header(":status");
        if n == 0 || status.as_deref() != Some("200") {
            self.fail(&format!("prefill answered {status:?}"));
            return;
        }
        let mut body = std::mem::take(&mut self.body);
        if self.steps.vllm {
            let answer = self
                .get_http_call_response_body(0, size)
                .unwrap_or_default();
            let params = serde_json::from_slice::<serde_json::Value>(&answer)
                .ok()
                .and_then(|mut v| v.get_mut("kv_transfer_params").map(|p| p.take()))
                .and_then(|p| serde_json::to_vec(&p).ok());
            let Some(params) = params else {
                self.fail("the prefill's answer has no kv_transfer_params");
                return;
            };
            body = appended(&body, &[br#","kv_transfer_params":"#, &params]);
        } else if self.steps.trtllm {
            let answer = self
                .get_http_call_response_body(0, size)
                .unwrap_or_default();
            let Some((params, ids)) = trtllm_handoff(&answer) else {
                self.fail("the context answer has no disaggregated_params or prompt_token_ids");
                return;
            };
            body = appended(
                &body,
                &[
                    br#","disaggregated_params":"#,
                    &params,
                    br#","prompt_token_ids":"#,
                    ids,
                ],
            );
        } else if self.steps.json {
            let answer = self
                .get_http_call_response_body(0, size)
                .unwrap_or_default();
            if !valid_json(&answer) {
                self.fail("the prefill's answer is not JSON");
                return;
            }
            if self.steps.edit {
                body = appended(&body, &[br#","kv_transfer_params":"#, &answer]);
            }
        }
        self.set_http_request_body(0, body.len(), &body);
        self.set_http_request_header("content-length", Some(&body.len().to_string()));
        self.set_http_request_header(ROUTE, Some(self.pods.1.as_str()));
        self.resume_http_request();
    }
}
