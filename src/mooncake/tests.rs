//! Learned engine ids as placement sees them.

use crate::error::PdError;
use crate::pods::{MemoryStore, SharedStore};
use crate::router::testkit::*;
use std::collections::HashMap;

#[test]
fn a_mooncake_prefill_takes_requests_once_its_engine_id_is_known() {
    let r = router(
        r#"{"models":[{"name":"m","engine":"vllm","kv_connector":"mooncake","rolesets":[
            {"prefill":["10.0.0.1:1"],"decode":["10.0.1.1:1"]}]}]}"#,
    );
    let mut store = MemoryStore::default();
    let req = request(&r, "m", "p");
    assert!(matches!(
        place(&r, &mut store, &req, &[]),
        Err(PdError::Unavailable(_))
    ));
    assert_eq!(r.asked_prefill_pods().len(), 1);
    let id = r.asked_prefill_pods()[0].pod.id;
    r.set_learned(HashMap::from([(id, vec!["engine-0".to_owned()])]));
    assert_eq!(
        prefill_of(&place(&r, &mut store, &req, &[]).expect("ready")),
        "10.0.0.1:1"
    );
    // Another VM learned the ids and shared them; this VM's tick has not
    // copied them yet: its placement reads them then and there.
    r.set_learned(HashMap::new());
    let learned = HashMap::from([(id, vec!["engine-0".to_owned()])]);
    let key = r.keys().mooncake_engines();
    store
        .shared_set(&key, &crate::mooncake::ids::encode(&learned), None)
        .expect("shared");
    assert_eq!(
        prefill_of(&place(&r, &mut store, &req, &[]).expect("ready at once")),
        "10.0.0.1:1"
    );
}

#[test]
fn a_generation_first_context_server_takes_requests_once_its_server_info_is_known() {
    let r = router(
        r#"{"models":[{"name":"m","engine":"trtllm","schedule_style":"generation_first","rolesets":[
            {"prefill":["10.0.0.1:1"],"decode":["10.0.1.1:1"]}]}]}"#,
    );
    let mut store = MemoryStore::default();
    let req = request(&r, "m", "p");
    assert!(matches!(
        place(&r, &mut store, &req, &[]),
        Err(PdError::Unavailable(_))
    ));
    let asked = r.asked_prefill_pods();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].ask, crate::mooncake::Ask::TrtServerInfo);
    let info = r#"{"ctx_dp_rank":0,"ctx_info_endpoint":"10.0.0.1:7"}"#.to_owned();
    r.set_learned(HashMap::from([(asked[0].pod.id, vec![info])]));
    assert_eq!(
        prefill_of(&place(&r, &mut store, &req, &[]).expect("ready")),
        "10.0.0.1:1"
    );
}

#[test]
fn a_context_first_model_asks_nothing() {
    let r = router(
        r#"{"models":[{"name":"m","engine":"trtllm","rolesets":[
            {"prefill":["10.0.0.1:1"],"decode":["10.0.1.1:1"]}]}]}"#,
    );
    assert!(r.asked_prefill_pods().is_empty());
    let mut store = MemoryStore::default();
    let req = request(&r, "m", "p");
    assert!(place(&r, &mut store, &req, &[]).is_ok());
}
