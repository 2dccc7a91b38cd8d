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

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

const ROUTE: &str = "x-envoy-original-dst-host";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

#[derive(Default, Clone, Copy)]
struct Steps {
    json: bool,
    edit: bool,
}

#[derive(Default)]
struct Root {
    pods: Rc<(String, String)>,
    steps: Steps,
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
        self.steps = Steps {
            json: has("json") || has("edit"),
            edit: has("edit"),
        };
        true
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream {
            pods: self.pods.clone(),
            steps: self.steps,
            body: Vec::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Stream {
    pods: Rc<(String, String)>,
    steps: Steps,
    body: Vec<u8>,
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
        self.body = self.get_http_request_body(0, size).unwrap_or_default();
        if self.steps.json && !valid_json(&self.body) {
            return self.fail("the body is not JSON");
        }
        let prefill = if self.steps.edit {
            appended(&self.body, &[br#","user":"min-pd","seed":1"#])
        } else {
            Vec::new()
        };
        let prefill_body = if self.steps.edit {
            &prefill
        } else {
            &self.body
        };
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
            Ok(_) => Action::Pause,
            Err(e) => self.fail(&format!("dispatch_http_call: {e:?}")),
        }
    }
}

impl Context for Stream {
    fn on_http_call_response(&mut self, _token: u32, n: usize, size: usize, _trailers: usize) {
        let status = self.get_http_call_response_header(":status");
        if n == 0 || status.as_deref() != Some("200") {
            self.fail(&format!("prefill answered {status:?}"));
            return;
        }
        let mut body = std::mem::take(&mut self.body);
        if self.steps.json {
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
