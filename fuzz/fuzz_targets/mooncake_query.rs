//! `parse_query` (a Mooncake bootstrap server's `GET /query` answer) on
//! arbitrary bytes.
//!
//! Checks: nothing panics; an accepted answer is a JSON object whose keys
//! are exactly the ranks 0..n, each with a non-empty string `engine_id`,
//! returned in rank order (checked against serde_json's own reading).
//! Found so far: invalid UTF-8 and out-of-range numbers and keys in skipped
//! values are accepted (harmless: what is read is checked).
#![no_main]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use libfuzzer_sys::fuzz_target;
use pd_router::transfer::parse_query;
use serde_json::value::RawValue;
use std::collections::BTreeMap;

fuzz_target!(|data: &[u8]| {
    let Ok(ids) = parse_query(data) else {
        return;
    };
    assert!(!ids.is_empty());
    // Values the router skips (worker_addr) are kept raw: serde_json checks
    // neither UTF-8 nor number range inside values it skips.
    #[derive(serde::Deserialize)]
    struct Entry {
        engine_id: Box<RawValue>,
    }
    let map: BTreeMap<String, Entry> = match serde_json::from_slice(data) {
        Ok(m) => m,
        Err(e) => panic!(
            "accepted {:?}, which is not an object of objects: {e}",
            String::from_utf8_lossy(data)
        ),
    };
    assert_eq!(map.len(), ids.len(), "one engine per rank");
    for (rank, id) in ids.iter().enumerate() {
        assert!(!id.is_empty());
        let entry = map
            .iter()
            .find(|(k, _)| k.parse::<u32>().ok() == Some(rank as u32))
            .unwrap_or_else(|| panic!("rank {rank} not in the answer"));
        let raw = &entry.1.engine_id;
        assert_eq!(
            serde_json::from_str::<String>(raw.get()).ok().as_deref(),
            Some(id.as_str())
        );
    }
});
