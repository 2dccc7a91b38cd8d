use super::stream::Stream;
use crate::config::Config;
use crate::engine::set_connector_type;
use crate::flow::Router;
use crate::host::Counter;
use crate::trt_id::WORKER_SLOTS;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel, MetricType};
use std::rc::Rc;

/// Metric ids, in the order of [`Counter::ALL`].
pub(super) type Metrics = Rc<Vec<(Counter, u32)>>;

#[derive(Default)]
pub(super) struct Root {
    router: Option<Rc<Router>>,
    metrics: Metrics,
}

fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

/// Hands this VM a distinct slot (mod [`WORKER_SLOTS`]) through shared data,
/// so TensorRT-LLM ids of different worker threads never collide. Shared data
/// is per `vm_id` and CAS-guarded; a lost race retries.
fn claim_worker_slot() -> u8 {
    const KEY: &str = "pd_router.worker_slots";
    for _ in 0..64 {
        let (value, cas) = match hostcalls::get_shared_data(KEY) {
            Ok(v) => v,
            Err(_) => break,
        };
        let current = value
            .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
            .map(u32::from_le_bytes)
            .unwrap_or(0);
        let next = current.wrapping_add(1);
        if hostcalls::set_shared_data(KEY, Some(&next.to_le_bytes()), cas).is_ok() {
            return (current % WORKER_SLOTS as u32) as u8;
        }
    }
    log(
        LogLevel::Warn,
        "pd-router: could not claim a worker slot; using 0",
    );
    0
}

impl Context for Root {}

impl RootContext for Root {
    fn on_vm_start(&mut self, _size: usize) -> bool {
        log(
            LogLevel::Info,
            concat!("pd-router ", env!("CARGO_PKG_VERSION"), " starting"),
        );
        true
    }

    fn on_configure(&mut self, size: usize) -> bool {
        let raw = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, size) {
            Ok(Some(raw)) => raw,
            _ => {
                log(LogLevel::Critical, "pd-router configuration: missing; the filter needs a JSON configuration with at least \"models\"");
                return false;
            }
        };
        let config = match Config::parse(&raw) {
            Ok(c) => c,
            Err(e) => {
                // Envoy refuses the config when this returns false; this line is
                // what the operator sees.
                log(LogLevel::Critical, &e.to_string());
                return false;
            }
        };
        set_connector_type(config.kv_connector);
        let router = match Router::new(config, claim_worker_slot()) {
            Ok(r) => r,
            Err(e) => {
                log(
                    LogLevel::Critical,
                    &format!("pd-router configuration: trt_machine_id: {e}"),
                );
                return false;
            }
        };
        for m in &router.config.models {
            if !router.registry.is_known(&m.engine) {
                log(
                    LogLevel::Warn,
                    &format!(
                        "pd-router: model {:?} uses engine {:?}, which has no handler; it gets the default handler (known: {})",
                        m.name,
                        m.engine,
                        router.registry.valid_engine_names().join(", ")
                    ),
                );
            }
        }
        let mut metrics = Vec::with_capacity(Counter::ALL.len());
        for c in Counter::ALL {
            match hostcalls::define_metric(MetricType::Counter, c.name()) {
                Ok(id) => metrics.push((c, id)),
                Err(e) => log(
                    LogLevel::Warn,
                    &format!("pd-router: metric {}: {e:?}", c.name()),
                ),
            }
        }
        self.metrics = Rc::new(metrics);
        self.router = Some(Rc::new(router));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let router = self.router.as_ref()?;
        Some(Box::new(Stream::new(
            Rc::clone(router),
            Rc::clone(&self.metrics),
        )))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
