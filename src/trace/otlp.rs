//! A batch of spans as OTLP/HTTP JSON (`ExportTraceServiceRequest`, the
//! protobuf JSON mapping the OTLP specification fixes: ids as lower-case
//! hex, 64-bit integers as strings, enums as numbers).

use super::context::to_hex;
use super::span::{AttrValue, Span};
use serde_json::{json, Value};

/// OTLP's status codes.
const STATUS_OK: u8 = 1;
const STATUS_ERROR: u8 = 2;

/// The body of `POST /v1/traces` for `spans`, from `service`.
pub fn encode(service: &str, spans: &[Span]) -> Vec<u8> {
    let spans: Vec<Value> = spans.iter().map(span).collect();
    let body = json!({"resourceSpans": [{
        "resource": {"attributes": [attribute("service.name", &AttrValue::Str(service.to_owned()))]},
        "scopeSpans": [{
            "scope": {"name": "pd-router", "version": env!("CARGO_PKG_VERSION")},
            "spans": spans,
        }],
    }]});
    serde_json::to_vec(&body).unwrap_or_default()
}

fn span(s: &Span) -> Value {
    let mut v = json!({
        "traceId": to_hex(&s.trace_id),
        "spanId": to_hex(&s.span_id),
        "name": s.name,
        "kind": s.kind as u8,
        "startTimeUnixNano": (s.start_us.saturating_mul(1000)).to_string(),
        "endTimeUnixNano": (s.end_us.max(s.start_us).saturating_mul(1000)).to_string(),
        "attributes": s.attributes.iter().map(|(k, a)| attribute(k, a)).collect::<Vec<_>>(),
        "status": match &s.error {
            None => json!({"code": STATUS_OK}),
            Some(m) => json!({"code": STATUS_ERROR, "message": m}),
        },
    });
    if let (Some(parent), Some(obj)) = (s.parent, v.as_object_mut()) {
        obj.insert("parentSpanId".into(), to_hex(&parent).into());
    }
    v
}

fn attribute(key: &str, value: &AttrValue) -> Value {
    let value = match value {
        AttrValue::Str(s) => json!({"stringValue": s}),
        AttrValue::Int(n) => json!({"intValue": n.to_string()}),
        AttrValue::Bool(b) => json!({"boolValue": b}),
    };
    json!({"key": key, "value": value})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::SpanKind;

    #[test]
    fn a_span_in_otlp_json() {
        let s = Span {
            trace_id: [0xab; 16],
            span_id: [1; 8],
            parent: Some([2; 8]),
            name: "pd_router.prefill",
            kind: SpanKind::Client,
            start_us: 1_700_000_000_000_000,
            end_us: 1_700_000_000_250_000,
            attributes: vec![("pd.pod", "p-0".into()), ("pd.tokens", 42u64.into())],
            error: Some("status 500".into()),
        };
        let v: Value = serde_json::from_slice(&encode("pd-router", &[s])).expect("json");
        let rs = &v["resourceSpans"][0];
        assert_eq!(
            rs["resource"]["attributes"][0],
            json!({"key": "service.name", "value": {"stringValue": "pd-router"}})
        );
        let span = &rs["scopeSpans"][0]["spans"][0];
        assert_eq!(span["traceId"], "abababababababababababababababab");
        assert_eq!(span["spanId"], "0101010101010101");
        assert_eq!(span["parentSpanId"], "0202020202020202");
        assert_eq!(span["kind"], 3);
        assert_eq!(span["startTimeUnixNano"], "1700000000000000000");
        assert_eq!(span["endTimeUnixNano"], "1700000000250000000");
        assert_eq!(span["attributes"][1]["value"]["intValue"], "42");
        assert_eq!(span["status"], json!({"code": 2, "message": "status 500"}));
    }
}
