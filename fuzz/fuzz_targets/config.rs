//! `Config::parse` on arbitrary bytes.
//!
//! Checks: nothing panics; an accepted configuration is consistent (models
//! found by name, every endpoint's slot pointing at its own identity) and
//! builds a `Router`.
#![no_main]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use libfuzzer_sys::fuzz_target;
use pd_router::config::Config;
use pd_router::router::Router;

fuzz_target!(|data: &[u8]| {
    let Ok(config) = Config::parse(data) else {
        return;
    };
    assert!(
        !config.models.is_empty(),
        "accepted a config without models"
    );
    let fleet = config.fleet();
    assert_eq!(
        fleet.models().len(),
        config.models.len(),
        "models lost in the fleet"
    );
    for m in fleet.models() {
        let found = fleet.model(&m.name).expect("model found by name");
        assert_eq!(found.name, m.name);
        let endpoints = m
            .rolesets
            .iter()
            .flat_map(|r| r.prefill.iter().chain(&r.decode))
            .chain(&m.combined);
        for e in endpoints {
            // Every endpoint's slot points at its own identity.
            let id = m
                .pods
                .get(e.slot)
                .unwrap_or_else(|| panic!("{}: slot {} out of range", e.address, e.slot));
            assert_eq!(*id, e.id, "slot of {}", e.address);
        }
    }
    Router::new(config, 0).expect("an accepted config builds a Router");
});
