//! Outbound mock-to-mock HTTP (KV pulls, bootstrap calls).
//!
//! The addresses dialled come from request bodies, i.e. from the router under
//! test. Unless --allow-remote-peers is given, only loopback hosts are
//! dialled: a router bug (or a test's deliberately bogus remote_host) then
//! fails fast with a clear message instead of sending traffic off the machine.

use std::net::IpAddr;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;

pub struct Peers {
    client: reqwest::Client,
    allow_remote: bool,
}

#[derive(Debug)]
pub enum PeerError {
    /// Host refused by the loopback policy (never dialled).
    Refused(String),
    Timeout,
    Unreachable(String),
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerError::Refused(m) | PeerError::Unreachable(m) => f.write_str(m),
            PeerError::Timeout => f.write_str("timed out"),
        }
    }
}

pub struct PeerResponse {
    pub status: StatusCode,
    pub body: Bytes,
}

impl PeerResponse {
    /// The body for error messages, shortened.
    pub fn text(&self) -> String {
        let s = String::from_utf8_lossy(&self.body);
        s.chars().take(200).collect()
    }
}

/// How a [`Peers::long_poll`] ended.
pub enum Polled {
    /// 200: what was waited for.
    Ready(PeerResponse),
    /// The peer's 504 at its deadline, or no answer by the client's.
    TimedOut,
    /// Any other answer.
    Refused(PeerResponse),
    /// Never answered (refused by policy, unreachable).
    Failed(PeerError),
}

/// `host:port` with IPv6 literals bracketed, as a URL authority needs.
pub fn authority(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Splits `host:port` (IPv6 hosts bracketed: `[::1]:5`) with a non-zero
/// port and a host that cannot alter a URL's structure.
pub fn split_authority(s: &str) -> Option<(String, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    if port_has_sign(s) {
        return None;
    }
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']')?,
        None if host.contains(':') => return None,
        None => host,
    };
    if host.is_empty() || host.contains(['/', '@', '?', '#', '[', ']', ' ']) {
        return None;
    }
    Some((host.to_string(), port))
}

/// `u16::from_str` takes a leading `+`, a URL port does not.
fn port_has_sign(s: &str) -> bool {
    s.rsplit_once(':').is_some_and(|(_, p)| p.starts_with('+'))
}

/// Percent-encodes everything but RFC 3986 unreserved characters, so ids
/// taken from request bodies cannot alter the URL's structure.
pub fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Peers {
    pub fn new(allow_remote: bool) -> Result<Self, reqwest::Error> {
        // no_proxy: an HTTP(S)_PROXY in the environment must not divert
        // loopback traffic between mocks.
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(2))
            .build()?;
        Ok(Peers {
            client,
            allow_remote,
        })
    }

    fn check_host(&self, authority: &str) -> Result<(), PeerError> {
        if self.allow_remote {
            return Ok(());
        }
        let host = match authority.rsplit_once(':') {
            Some((h, _)) => h,
            None => authority,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if loopback {
            Ok(())
        } else {
            Err(PeerError::Refused(format!(
                "refusing to dial non-loopback host {host:?} (the mock only talks to \
                 127.0.0.0/8, ::1 and localhost unless started with --allow-remote-peers)"
            )))
        }
    }

    /// GET `http://{authority}{path_and_query}` with an overall timeout.
    pub async fn get(
        &self,
        authority: &str,
        path_and_query: &str,
        timeout: Duration,
    ) -> Result<PeerResponse, PeerError> {
        self.check_host(authority)?;
        let url = format!("http://{authority}{path_and_query}");
        let req = self.client.get(url).timeout(timeout);
        send(req).await
    }

    /// GET a path the peer holds open until what it waits for comes or
    /// `wait` passes, when it answers 504. The client allows 2 s more,
    /// which only covers a peer that stops answering altogether.
    pub async fn long_poll(&self, authority: &str, path: &str, wait: Duration) -> Polled {
        match self
            .get(authority, path, wait + Duration::from_secs(2))
            .await
        {
            Ok(r) if r.status == StatusCode::OK => Polled::Ready(r),
            Ok(r) if r.status == StatusCode::GATEWAY_TIMEOUT => Polled::TimedOut,
            Ok(r) => Polled::Refused(r),
            Err(PeerError::Timeout) => Polled::TimedOut,
            Err(e) => Polled::Failed(e),
        }
    }

    pub async fn post_json(
        &self,
        authority: &str,
        path: &str,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<PeerResponse, PeerError> {
        self.check_host(authority)?;
        let url = format!("http://{authority}{path}");
        let req = self.client.post(url).json(body).timeout(timeout);
        send(req).await
    }

    pub async fn put_json(
        &self,
        authority: &str,
        path: &str,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<PeerResponse, PeerError> {
        self.check_host(authority)?;
        let url = format!("http://{authority}{path}");
        let req = self.client.put(url).json(body).timeout(timeout);
        send(req).await
    }
}

async fn send(req: reqwest::RequestBuilder) -> Result<PeerResponse, PeerError> {
    let classify = |e: reqwest::Error| {
        if e.is_timeout() {
            PeerError::Timeout
        } else {
            // The source chain carries the useful part ("Connection refused").
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg = format!("{msg}: {s}");
                src = s.source();
            }
            PeerError::Unreachable(msg)
        }
    };
    let resp = req.send().await.map_err(classify)?;
    let status =
        StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = resp.bytes().await.map_err(classify)?;
    Ok(PeerResponse { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_policy() {
        let p = Peers::new(false).expect("client");
        assert!(p.check_host("127.0.0.1:80").is_ok());
        assert!(p.check_host("127.0.0.2:80").is_ok());
        assert!(p.check_host("[::1]:80").is_ok());
        assert!(p.check_host("localhost:80").is_ok());
        assert!(p.check_host("192.0.2.1:80").is_err());
        assert!(p.check_host("example.com:80").is_err());
        assert!(Peers::new(true)
            .expect("client")
            .check_host("192.0.2.1:80")
            .is_ok());
    }

    #[test]
    fn splits_authorities() {
        assert_eq!(
            split_authority("127.0.0.1:80"),
            Some(("127.0.0.1".into(), 80))
        );
        assert_eq!(split_authority("[::1]:80"), Some(("::1".into(), 80)));
        assert_eq!(split_authority("h:65535"), Some(("h".into(), 65535)));
        for bad in [
            "h", "h:0", "h:x", "h:65536", ":80", "::1:80", "a/b:80", "u@h:80", "h:+80", "[::1:80",
        ] {
            assert_eq!(split_authority(bad), None, "{bad}");
        }
    }

    #[test]
    fn encodes_authority_and_ids() {
        assert_eq!(authority("::1", 5), "[::1]:5");
        assert_eq!(authority("127.0.0.1", 5), "127.0.0.1:5");
        assert_eq!(pct("a/b?c"), "a%2Fb%3Fc");
    }
}
