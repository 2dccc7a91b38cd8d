//! Server-sent events as the mocks send them: every event of an answer at
//! once, or one by one with a pause between them (`--stream-delay-ms`).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;

/// A 200 `text/event-stream` answer with `body`.
pub fn sse(body: Body) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Every event in one body.
pub fn at_once(events: Vec<String>) -> Response {
    sse(Body::from(events.concat()))
}

/// The events one by one, `delay` apart; `on_end` runs once the last one
/// is out (not when the client hangs up first).
pub fn streamed<F>(events: Vec<String>, delay: Duration, on_end: F) -> Response
where
    F: FnOnce() + Send + 'static,
{
    let stream = futures_util::stream::unfold(
        (events.into_iter(), true, Some(on_end)),
        move |(mut events, first, mut on_end)| async move {
            let Some(event) = events.next() else {
                if let Some(f) = on_end.take() {
                    f();
                }
                return None;
            };
            if !first && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Some((
                Ok::<_, Infallible>(Bytes::from(event)),
                (events, false, on_end),
            ))
        },
    );
    sse(Body::from_stream(stream))
}
