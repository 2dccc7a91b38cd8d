//! `Config::parse` on arbitrary bytes.
//!
//! Checks: nothing panics; an accepted configuration is consistent (models
//! found by name at their index, every endpoint's pod index pointing at its
//! own address) and builds a `Router`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pd_router::config::Config;
use pd_router::flow::Router;

fuzz_target!(|data: &[u8]| {
    let Ok(config) = Config::parse(data) else {
        return;
    };
    assert!(
        !config.models.is_empty(),
        "accepted a config without models"
    );
    for (i, m) in config.models.iter().enumerate() {
        let (j, found) = config.model_entry(&m.name).expect("model found by name");
        assert_eq!((j, &found.name), (i, &m.name), "model_entry({:?})", m.name);
        let endpoints = m
            .rolesets
            .iter()
            .flat_map(|r| r.prefill.iter().chain(&r.decode))
            .chain(&m.combined);
        for e in endpoints {
            let pod = config
                .pods
                .get(e.pod)
                .unwrap_or_else(|| panic!("{}: pod index {} out of range", e.address, e.pod));
            assert_eq!(pod.address, e.address, "pod index of {}", e.address);
        }
    }
    Router::new(config, 0).expect("an accepted config builds a Router");
});
