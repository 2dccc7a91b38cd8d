//! `p2p_request_id` (vLLM P2P NCCL's request id naming both pods' ZMQ
//! addresses) for arbitrary pod addresses, ports and nonces.
//!
//! Checks: IPv6 pods get no id; for IPv4 pods, vLLM's own patterns, applied
//! with Python `re.search` semantics (leftmost, greedy), give back exactly
//! each pod's IP and `kv_port`: the prefill reads
//! `___decode_addr_(.*):(\d+)`, the decode `___prefill_addr_(.*):(\d+)___`.
#![no_main]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use libfuzzer_sys::fuzz_target;
use pd_router::fleet::Endpoint;
use pd_router::transfer::p2p_request_id;
use regex::Regex;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

fn pod(b: &[u8], v6: bool) -> Endpoint {
    let ip = if v6 {
        let mut o = [0u8; 16];
        o.copy_from_slice(&b[..16]);
        IpAddr::V6(Ipv6Addr::from(o))
    } else {
        IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    };
    let mut e = Endpoint::new(SocketAddr::new(ip, 8000), None);
    e.kv_port = u16::from_le_bytes([b[16], b[17]]).max(1);
    e
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 38 {
        return;
    }
    let (p, d, rest) = (&data[..18], &data[18..36], &data[36..]);
    let flags = rest[0];
    let nonce: String = rest[1..].iter().map(|b| format!("{b:02x}")).collect();
    let (prefill, decode) = (pod(p, flags & 1 == 1), pod(d, flags & 2 == 2));
    let id = p2p_request_id(&prefill, &decode, &nonce);
    if flags & 3 != 0 {
        assert_eq!(id, None, "IPv6 pods cannot be named");
        return;
    }
    let id = id.expect("IPv4 pods");
    let at_prefill = Regex::new(r"___decode_addr_(.*):(\d+)").unwrap();
    let at_decode = Regex::new(r"___prefill_addr_(.*):(\d+)___").unwrap();
    let c = at_prefill
        .captures(&id)
        .expect("the prefill finds the decode");
    assert_eq!(
        (&c[1], c[2].parse::<u16>().ok()),
        (decode.ip.as_str(), Some(decode.kv_port)),
        "{id}"
    );
    let c = at_decode
        .captures(&id)
        .expect("the decode finds the prefill");
    assert_eq!(
        (&c[1], c[2].parse::<u16>().ok()),
        (prefill.ip.as_str(), Some(prefill.kv_port)),
        "{id}"
    );
});
