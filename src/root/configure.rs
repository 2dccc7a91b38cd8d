//! The plugin configuration read into a router: parsed and validated, this
//! replica's TensorRT-LLM machine id and signing key taken from the VM
//! environment, and a worker slot leased (`crate::pods::slots`): the key
//! every VM's shared records and TensorRT-LLM ids are kept apart by.

use crate::config::{Config, ConfigError};
use crate::pods::slots::{ensure_table, lease_slot};
use crate::pods::SharedStore;
use crate::pods::WORKER_SLOTS_KEY;
use crate::router::Router;

/// A configured router, and what the operator should read about it.
pub struct Configured {
    pub router: Router,
    /// The Kubernetes API's bearer token from the VM environment, when
    /// pods are discovered and the variable holds one.
    pub kube_token: Option<String>,
    /// Info lines (how hand-offs are signed).
    pub notes: Vec<String>,
    /// Warning lines (engines without a handler, a slot not claimed).
    pub warnings: Vec<String>,
}

fn error(path: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// Reads the plugin configuration (`None`: Envoy gave none). `env` reads
/// the VM's environment; `vm` is this VM's random id, which its slot lease
/// is held by, and `now_ms` the time. A refused configuration is one error
/// whose text is what the operator sees in Envoy's log.
pub fn configure<S: SharedStore + ?Sized>(
    raw: Option<&[u8]>,
    env: &dyn Fn(&str) -> Option<String>,
    store: &mut S,
    vm: u64,
    now_ms: u64,
) -> Result<Configured, ConfigError> {
    let raw = raw.ok_or_else(|| {
        error(
            "",
            "missing; the filter needs a JSON configuration with at least \"models\"",
        )
    })?;
    let mut config = Config::parse(raw)?;
    let var = &config.trt.machine_id_env;
    if let Some(v) = env(var).filter(|v| !v.trim().is_empty()) {
        config.trt.machine_id = crate::trt_id::machine_id_from(&v)
            .map_err(|e| error("trt_machine_id_env", format!("${var}: {e}")))?;
    }
    let auth_key = env(&config.trt.auth_key_env).filter(|k| !k.is_empty());
    let mut warnings = Vec::new();
    // The first configure of a plugin runs in Envoy's configuration canary,
    // before any worker VM: the table exists before anyone contends for it.
    ensure_table(store, WORKER_SLOTS_KEY);
    let slot = lease_slot(store, WORKER_SLOTS_KEY, vm, None, now_ms).unwrap_or_else(|| {
        warnings.push(format!("pd-router: all {} worker slots are leased by live VMs (more Envoy workers than that?); this VM shares slot 0, so its load counts and another VM's overwrite each other and TensorRT-LLM ids may collide", crate::trt_id::WORKER_SLOTS));
        0
    });
    let mut router = Router::leased(config, slot, vm, now_ms)
        .map_err(|e| error("trt_machine_id", e.to_string()))?;
    let mut notes = Vec::new();
    if auth_key.is_some() {
        notes.push(format!(
            "pd-router: TensorRT-LLM hand-offs are signed with the key in ${}",
            router.config.trt.auth_key_env
        ));
    }
    router.set_trt_auth_key(auth_key.map(String::into_bytes));
    for m in &router.config.models {
        if !router.registry.is_known(&m.engine) {
            warnings.push(format!(
                "pd-router: model {:?} uses engine {:?}, which has no handler; it gets the default handler (known: {})",
                m.name,
                m.engine,
                router.registry.valid_engine_names().join(", ")
            ));
        }
    }
    let kube_token = router.config.discovery.as_ref().and_then(|d| {
        let token = env(&d.token_env)
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        if token.is_none() {
            notes.push(format!(
                "pd-router discovery: no token in the VM environment variable {:?}; calling the API server without an Authorization header (deploy/ has Envoy add one: a credential_injector on the cluster)",
                d.token_env
            ));
        }
        token
    });
    Ok(Configured {
        router,
        kube_token,
        notes,
        warnings,
    })
}
