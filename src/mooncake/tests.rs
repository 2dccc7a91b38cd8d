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
    assert_eq!(r.mooncake_prefill_pods().len(), 1);
    let id = r.mooncake_prefill_pods()[0].id;
    r.set_mooncake_engines(HashMap::from([(id, vec!["engine-0".to_owned()])]));
    assert_eq!(
        prefill_of(&place(&r, &mut store, &req, &[]).expect("ready")),
        "10.0.0.1:1"
    );
    // Another VM learned the ids and shared them; this VM's tick has not
    // copied them yet: its placement reads them then and there.
    r.set_mooncake_engines(HashMap::new());
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
