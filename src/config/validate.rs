//! Checks the raw configuration and builds the typed one: every error
//! names the field by its JSON path and says what to fix.

use super::error::{err, ConfigError};
use super::raw::{EndpointSpec, RawConfig, RawEndpoint, RawModel, RawNixlPeer};
use super::settings::{
    Config, PrefillSettings, Routing, RoutingSettings, ScrapeSettings, TrtSettings,
};
use crate::admission::Admission;
use crate::discovery::KubeDiscovery;
use crate::fleet::{
    Connector, Decider, DecodePolicy, EcConnector, Endpoint, EngineKind, KvReuse, Model,
    ModelSettings, NixlPeer, PrefillPolicy, RolesetPods, SessionAffinity, TokenRange,
    DEFAULT_BOOTSTRAP_PORT, DEFAULT_BYTES_PER_TOKEN, DEFAULT_NIXL_SIDE_CHANNEL_PORT,
};
use crate::load::HealthRule;
use crate::trace::Tracing;
use std::net::SocketAddr;

/// The typed configuration of `raw` (its fingerprint still empty).
pub(crate) fn config(raw: RawConfig) -> Result<Config, ConfigError> {
    check_settings(&raw)?;
    let max_body_bytes = usize::try_from(raw.max_body_bytes)
        .map_err(|_| err("max_body_bytes", "is larger than this platform can address"))?;
    let trt_machine_id = crate::trt_id::validate_trt_machine_id(raw.trt_machine_id)
        .map_err(|e| err("trt_machine_id", e.to_string()))?;
    let kv_connector = parse_connector(&raw.kv_connector, "kv_connector")?;
    let discovery = raw.discovery.map(|d| d.kubernetes);
    if let Some(d) = &discovery {
        check_discovery(d)?;
    }
    let raw_models = raw.models.unwrap_or_default();
    if raw_models.is_empty() && discovery.is_none() {
        return Err(err(
            "models",
            "at least one model is required (or pods discovered: discovery.kubernetes)",
        ));
    }
    let mut routing = routing(
        raw.routing.as_deref(),
        raw.routing_header.as_deref(),
        &raw.prefill_cluster,
    )?;
    routing.picker = placement_by_picker(raw.placement.as_deref())?;
    let models = models(raw_models)?;
    check_push_peers(&models, kv_connector)?;
    check_kv_reuse(&models, kv_connector)?;
    check_adapter_names(&models)?;
    let discovery = discovery.map(|mut d| {
        if d.inference_pool.is_none() {
            d.narrow_to(models.iter().map(|m| m.name.as_str()));
        }
        d
    });
    Ok(Config {
        scrape: ScrapeSettings {
            interval_ms: raw.scrape_interval_ms,
            timeout_ms: raw.scrape_timeout_ms,
            ttl_ms: raw.metrics_ttl_ms,
            path: raw.metrics_path,
            cluster: raw
                .metrics_cluster
                .unwrap_or_else(|| raw.prefill_cluster.clone()),
        },
        routing,
        prefill: PrefillSettings {
            timeout_ms: raw.prefill_timeout_ms,
            max_retries: raw.prefill_max_retries,
        },
        health: HealthRule {
            cooldown_ms: raw.unhealthy_cooldown_ms,
            eject_after_failures: raw.eject_after_failures.max(1),
        },
        trt: TrtSettings {
            machine_id: trt_machine_id,
            machine_id_env: raw.trt_machine_id_env,
            auth_key_env: raw.trt_auth_key_env,
        },
        kv_connector,
        kv_lease_ms: raw.kv_lease_ms,
        max_body_bytes,
        timing_headers: raw.timing_headers,
        max_pod_stats: raw.max_pod_stats,
        scheduling: raw.scheduling,
        models,
        discovery,
        admission: admission(raw.admission)?,
        objectives: raw.objectives,
        tracing: tracing(raw.tracing)?,
        fingerprint: String::new(),
    })
}

/// Whether an endpoint picker places requests (`placement`).
fn placement_by_picker(placement: Option<&str>) -> Result<bool, ConfigError> {
    match placement {
        None | Some("own") => Ok(false),
        Some("epp") => Ok(true),
        Some(other) => Err(err(
            "placement",
            format!("unknown placement {other:?}; expected one of: own, epp"),
        )),
    }
}

/// Each model of `models[]`, no name twice.
fn models(raw: Vec<RawModel>) -> Result<Vec<Model>, ConfigError> {
    let mut models: Vec<Model> = Vec::with_capacity(raw.len());
    for (mi, m) in raw.into_iter().enumerate() {
        if !m.name.is_empty() && models.iter().any(|other| other.name == m.name) {
            return Err(err(
                format!("models[{mi}].name"),
                format!("model {:?} is configured twice", m.name),
            ));
        }
        models.push(model(m, &format!("models[{mi}]"))?);
    }
    Ok(models)
}

/// `tracing`, checked.
fn tracing(t: Option<Tracing>) -> Result<Option<Tracing>, ConfigError> {
    let Some(t) = t else { return Ok(None) };
    if let Some((field, why)) = t.problem() {
        return Err(err(format!("tracing.{field}"), why));
    }
    Ok(Some(t))
}

/// `admission`, when it sets a limit.
fn admission(a: Option<Admission>) -> Result<Option<Admission>, ConfigError> {
    let Some(a) = a else { return Ok(None) };
    if a.queue_ttl_ms == 0 {
        return Err(err("admission.queue_ttl_ms", "must be greater than 0"));
    }
    if a.max_queued == 0 {
        return Err(err("admission.max_queued", "must be greater than 0"));
    }
    if !(50..=1000).contains(&a.tick_ms) {
        return Err(err("admission.tick_ms", "must be from 50 to 1000"));
    }
    Ok(a.is_on().then_some(a))
}

/// The routing mode, its header and the prefill cluster.
fn routing(
    mode: Option<&str>,
    header: Option<&str>,
    prefill_cluster: &str,
) -> Result<RoutingSettings, ConfigError> {
    let mode = match mode {
        None => Routing::default(),
        Some(r) => Routing::from_name(r).ok_or_else(|| {
            err(
                "routing",
                format!(
                    "unknown routing {r:?}; expected one of: {}",
                    Routing::NAMES.join(", ")
                ),
            )
        })?,
    };
    let header = header
        .map(str::trim)
        .unwrap_or(mode.default_header())
        .to_owned();
    Ok(RoutingSettings {
        mode,
        header,
        prefill_cluster: prefill_cluster.to_owned(),
        picker: false,
    })
}

/// The top-level values that have a valid range.
fn check_settings(raw: &RawConfig) -> Result<(), ConfigError> {
    if raw.prefill_cluster.trim().is_empty() {
        return Err(err("prefill_cluster", "must name an Envoy cluster"));
    }
    if let Some(header) = &raw.routing_header {
        let h = header.trim();
        if h.is_empty()
            || !h
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(err(
                "routing_header",
                format!("{header:?} is not a lowercase HTTP header name"),
            ));
        }
    }
    if raw.prefill_timeout_ms == 0 || raw.prefill_timeout_ms > u32::MAX as u64 {
        return Err(err(
            "prefill_timeout_ms",
            format!("must be between 1 and {}", u32::MAX),
        ));
    }
    if raw.kv_lease_ms == 0 {
        return Err(err("kv_lease_ms", "must be greater than 0"));
    }
    if raw.max_body_bytes == 0 {
        return Err(err("max_body_bytes", "must be greater than 0"));
    }
    let sch = &raw.scheduling;
    if sch.prefix_block_tokens == 0 {
        return Err(err(
            "scheduling.prefix_block_tokens",
            "must be greater than 0",
        ));
    }
    if sch.prefix_table_slots == 0 {
        return Err(err(
            "scheduling.prefix_table_slots",
            "must be greater than 0",
        ));
    }
    if let Some((name, _)) = sch
        .ratios()
        .into_iter()
        .find(|(_, v)| !v.is_finite() || *v < 0.0)
    {
        return Err(err(
            format!("scheduling.{name}"),
            "must be a finite number >= 0",
        ));
    }
    if raw.scrape_interval_ms > 0 && raw.scrape_timeout_ms == 0 {
        return Err(err("scrape_timeout_ms", "must be greater than 0"));
    }
    if !raw.metrics_path.starts_with('/') {
        return Err(err("metrics_path", "must start with /"));
    }
    Ok(())
}

/// `discovery.kubernetes`: values with a valid range.
fn check_discovery(d: &KubeDiscovery) -> Result<(), ConfigError> {
    let p = "discovery.kubernetes";
    if d.cluster.trim().is_empty() {
        return Err(err(
            format!("{p}.cluster"),
            "must name the Envoy cluster that reaches the API server",
        ));
    }
    if d.authority.trim().is_empty() {
        return Err(err(format!("{p}.authority"), "must not be empty"));
    }
    if d.interval_ms < 100 {
        return Err(err(format!("{p}.interval_ms"), "must be at least 100"));
    }
    if d.timeout_ms == 0 || d.timeout_ms > u32::MAX as u64 {
        return Err(err(
            format!("{p}.timeout_ms"),
            format!("must be between 1 and {}", u32::MAX),
        ));
    }
    if d.page_size == 0 {
        return Err(err(format!("{p}.page_size"), "must be greater than 0"));
    }
    // The API server takes timeoutSeconds as an int64, but a watch that
    // outlives the lease (and stalls changes) helps nobody.
    if d.watch_seconds == 0 || d.watch_seconds > 600 {
        return Err(err(
            format!("{p}.watch_seconds"),
            "must be between 1 and 600",
        ));
    }
    if let Some(pool) = &d.inference_pool {
        if pool.name.trim().is_empty() {
            return Err(err(
                format!("{p}.inference_pool.name"),
                "must name the InferencePool",
            ));
        }
        if d.label_selector.is_some() {
            return Err(err(
                format!("{p}.label_selector"),
                "the InferencePool's selector says which pods: leave label_selector unset",
            ));
        }
    }
    if d.stale_after_ms < d.interval_ms.max(d.watch_seconds.saturating_mul(1000)) {
        return Err(err(
            format!("{p}.stale_after_ms"),
            "must be at least interval_ms and watch_seconds (a fresh set would read as stale)",
        ));
    }
    Ok(())
}

/// One `models[]` entry, validated, with its static pods.
fn model(m: RawModel, mp: &str) -> Result<Model, ConfigError> {
    if m.name.is_empty() {
        return Err(err(format!("{mp}.name"), "must not be empty"));
    }
    if m.trt_token_ids_b64 && EngineKind::of(&m.engine) != EngineKind::Trtllm {
        return Err(err(
            format!("{mp}.trt_token_ids_b64"),
            format!(
                "is a TensorRT-LLM hand-off, and this model's engine is {:?}: remove it, or \
                 set \"engine\": \"trtllm\"",
                m.engine
            ),
        ));
    }
    let settings = ModelSettings {
        ec_connector: ec_connector(m.ec_connector.as_deref(), &m.engine, mp)?,
        kv_connector: m
            .kv_connector
            .as_deref()
            .map(|c| parse_connector(c, &format!("{mp}.kv_connector")))
            .transpose()?,
        prefill_policy: policy(
            m.prefill_policy.as_deref(),
            &format!("{mp}.prefill_policy"),
            PrefillPolicy::from_name,
            &PrefillPolicy::NAMES,
        )?,
        decode_policy: policy(
            m.decode_policy.as_deref(),
            &format!("{mp}.decode_policy"),
            DecodePolicy::from_name,
            &DecodePolicy::NAMES,
        )?,
        trt_token_ids_b64: m.trt_token_ids_b64,
        trt_generation_first: schedule_style(m.schedule_style.as_deref(), &m.engine, mp)?,
        decider: decider(m.decider, &m.engine, mp)?,
        kv_reuse: kv_reuse(m.kv_reuse, &m.engine, m.session.is_some(), mp)?,
        session: session(m.session, mp)?,
        bytes_per_token: bytes_per_token(m.bytes_per_token, mp)?,
        adapters: adapters(m.adapters, &m.name, mp)?,
        name: m.name,
        engine: m.engine,
    };
    let endpoints = |list: Vec<RawEndpoint>, path: &str| {
        list.into_iter()
            .enumerate()
            .map(|(ei, e)| endpoint(e.0, &format!("{path}[{ei}]")))
            .collect::<Result<Vec<_>, _>>()
    };
    let mut rolesets = Vec::with_capacity(m.rolesets.len());
    for (ri, rs) in m.rolesets.into_iter().enumerate() {
        let rp = format!("{mp}.rolesets[{ri}]");
        if let Some(r) = rs.prompt_tokens {
            check_range(r, &format!("{rp}.prompt_tokens"))?;
        }
        if !rs.encode.is_empty() && settings.ec_connector.is_none() {
            return Err(err(
                format!("{rp}.encode"),
                format!(
                    "encoder pods need the model's EC connector: set {mp}.ec_connector \
                     (one of: {})",
                    EcConnector::NAMES.join(", ")
                ),
            ));
        }
        rolesets.push(RolesetPods {
            name: rs.name.unwrap_or_else(|| format!("rs{ri}")),
            prefill: endpoints(rs.prefill, &format!("{rp}.prefill"))?,
            decode: endpoints(rs.decode, &format!("{rp}.decode"))?,
            encode: endpoints(rs.encode, &format!("{rp}.encode"))?,
            prompt_tokens: rs.prompt_tokens,
        });
    }
    let combined = endpoints(m.combined, &format!("{mp}.combined"))?;
    Ok(Model::new(settings, rolesets, combined))
}

/// A decider, where the engine's decode can serve a request unsplit: vLLM's
/// and TensorRT-LLM's decode (generation) servers compute a prompt that
/// came without a hand-off; SGLang's refuse one without bootstrap data.
fn decider(d: Option<Decider>, engine: &str, mp: &str) -> Result<Option<Decider>, ConfigError> {
    if d.is_some() && EngineKind::of(engine) == EngineKind::Sglang {
        return Err(err(
            format!("{mp}.decider"),
            "SGLang decode servers refuse requests without bootstrap data, so this model \
             cannot send a request unsplit to its decode pod: remove the decider, and serve \
             short prompts on pods that do both phases (`combined`, with `prompt_tokens` \
             buckets)",
        ));
    }
    Ok(d)
}

/// Session affinity: header names as Envoy hands them (lower case), body
/// members as dotted paths, a load bound no pod can be held under.
/// `kv_reuse`: a vLLM model's, keyed by its sessions.
fn kv_reuse(
    r: Option<KvReuse>,
    engine: &str,
    session: bool,
    mp: &str,
) -> Result<Option<KvReuse>, ConfigError> {
    let Some(r) = r else { return Ok(None) };
    let at = format!("{mp}.kv_reuse");
    if EngineKind::of(engine) != EngineKind::Vllm {
        return Err(err(
            at,
            format!("is vLLM's bidirectional NIXL transfer, and this model's engine is {engine:?}"),
        ));
    }
    if !session {
        return Err(err(
            at,
            "needs `session`: a decode's KV is kept for the session's next turn, so something must name the session",
        ));
    }
    if r.ttl_ms == 0 {
        return Err(err(format!("{at}.ttl_ms"), "must be greater than 0"));
    }
    if !(1..=65_536).contains(&r.max_entries) {
        return Err(err(format!("{at}.max_entries"), "must be from 1 to 65536"));
    }
    Ok(Some(r))
}

fn session(s: Option<SessionAffinity>, mp: &str) -> Result<Option<SessionAffinity>, ConfigError> {
    let Some(mut s) = s else { return Ok(None) };
    let sp = format!("{mp}.session");
    if s.headers.is_empty() && s.body_fields.is_empty() {
        return Err(err(
            sp,
            "names no header and no body field: nothing would name a session (leave out `headers` and `body_fields` for the defaults)",
        ));
    }
    for (i, h) in s.headers.iter_mut().enumerate() {
        let valid = !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !valid {
            return Err(err(
                format!("{sp}.headers[{i}]"),
                format!("{h:?} is not a header name (letters, digits, '-', '_', '.')"),
            ));
        }
        h.make_ascii_lowercase();
    }
    for (i, f) in s.body_fields.iter().enumerate() {
        if f.is_empty() || f.split('.').any(str::is_empty) {
            return Err(err(
                format!("{sp}.body_fields[{i}]"),
                format!("{f:?} is not a member path (names joined by '.', e.g. \"metadata.session_id\")"),
            ));
        }
    }
    if !(s.load_factor.is_finite() && s.load_factor >= 1.0) {
        return Err(err(
            format!("{sp}.load_factor"),
            format!(
                "{} cannot bound a pod's load: give a finite number of at least 1 (1.5 by default; 1 keeps pods level, higher keeps sessions home longer)",
                s.load_factor
            ),
        ));
    }
    Ok(Some(s))
}

/// TensorRT-LLM's `schedule_style` (its disaggregated server's key of the
/// same name): whether the generation leg goes out with the context leg.
fn schedule_style(v: Option<&str>, engine: &str, mp: &str) -> Result<bool, ConfigError> {
    let at = || format!("{mp}.schedule_style");
    let generation_first = match v {
        None | Some("context_first") => false,
        Some("generation_first") => true,
        Some(other) => {
            return Err(err(
                at(),
                format!("{other:?} is not a schedule style: use \"context_first\" (the default) or \"generation_first\""),
            ))
        }
    };
    if v.is_some() && EngineKind::of(engine) != EngineKind::Trtllm {
        return Err(err(
            at(),
            format!(
                "is TensorRT-LLM's order of the two legs, and this model's engine is {engine:?}: \
                 remove it, or set \"engine\": \"trtllm\""
            ),
        ));
    }
    Ok(generation_first)
}

fn bytes_per_token(v: Option<f64>, mp: &str) -> Result<f64, ConfigError> {
    match v {
        None => Ok(DEFAULT_BYTES_PER_TOKEN),
        Some(b) if b.is_finite() && b > 0.0 => Ok(b),
        Some(_) => Err(err(
            format!("{mp}.bytes_per_token"),
            "must be a finite number above 0",
        )),
    }
}

/// A model's LoRA adapters: names a request can give as its `model`.
fn adapters(list: Vec<String>, model: &str, mp: &str) -> Result<Vec<String>, ConfigError> {
    for (i, a) in list.iter().enumerate() {
        let at = format!("{mp}.adapters[{i}]");
        if a.is_empty() {
            return Err(err(at, "must not be empty"));
        }
        if a == model {
            return Err(err(at, "is the model's own name: list only its adapters"));
        }
        if list.get(..i).is_some_and(|seen| seen.contains(a)) {
            return Err(err(at, format!("adapter {a:?} is listed twice")));
        }
    }
    Ok(list)
}

/// A name means one set of weights: an adapter named like another model,
/// or listed under two models, would be placed on pods that may not have it.
fn check_adapter_names(models: &[Model]) -> Result<(), ConfigError> {
    for (mi, m) in models.iter().enumerate() {
        for (ai, a) in m.adapters.iter().enumerate() {
            let at = format!("models[{mi}].adapters[{ai}]");
            if models.iter().any(|o| o.name == *a) {
                return Err(err(at, format!("{a:?} is also a model's name")));
            }
            if let Some(o) = models
                .get(..mi)
                .and_then(|before| before.iter().find(|o| o.adapters.contains(a)))
            {
                return Err(err(
                    at,
                    format!("adapter {a:?} is also listed under model {:?}", o.name),
                ));
            }
        }
    }
    Ok(())
}

/// vLLM NIXL push tells the decode where the prefill's side channel is, and
/// only configuration knows: a push prefill pod without it could never serve.
/// Next-turn reuse is a NIXL pull transfer (vLLM refuses it for push).
fn check_kv_reuse(models: &[Model], global: Connector) -> Result<(), ConfigError> {
    for (mi, m) in models.iter().enumerate() {
        let connector = m.kv_connector.unwrap_or(global);
        if m.kv_reuse.is_some() && connector != Connector::Nixl {
            return Err(err(
                format!("models[{mi}].kv_reuse"),
                format!(
                    "needs the nixl connector (pull), and this model's is {:?}: vLLM's bidirectional transfer is NIXL pull only",
                    connector.name()
                ),
            ));
        }
    }
    Ok(())
}

fn check_push_peers(models: &[Model], global: Connector) -> Result<(), ConfigError> {
    for (mi, m) in models.iter().enumerate() {
        if m.kind != EngineKind::Vllm {
            continue;
        }
        for (ri, rs) in m.rolesets.iter().enumerate() {
            for (pi, p) in rs.prefill.iter().enumerate() {
                let connector = p.connector(m.kv_connector, global);
                if connector == Connector::NixlPush && p.nixl_push.is_none() {
                    return Err(err(
                        format!("models[{mi}].rolesets[{ri}].prefill[{pi}]"),
                        "the nixl_push connector needs the pod's side channel: \
                         add \"nixl_push\": {\"engine_id\": ...} (its kv_transfer_config.engine_id)",
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A policy name, or the default when absent.
fn policy<P: Default>(
    name: Option<&str>,
    path: &str,
    from_name: fn(&str) -> Option<P>,
    names: &[&str],
) -> Result<P, ConfigError> {
    match name {
        None => Ok(P::default()),
        Some(n) => from_name(n).ok_or_else(|| {
            err(
                path,
                format!(
                    "unknown policy {n:?}; expected one of: {}",
                    names.join(", ")
                ),
            )
        }),
    }
}

fn check_range(r: TokenRange, path: &str) -> Result<(), ConfigError> {
    if r.min > r.max {
        return Err(err(path, format!("min {} is above max {}", r.min, r.max)));
    }
    Ok(())
}

/// vLLM's EC connector of an E/P/D model: the encoder-cache hand-off is
/// vLLM's (`ec_transfer_params`); SGLang's language-only prefill calls its
/// encoders itself (docs/engines.md).
fn ec_connector(
    name: Option<&str>,
    engine: &str,
    mp: &str,
) -> Result<Option<EcConnector>, ConfigError> {
    let Some(name) = name else {
        return Ok(None);
    };
    let path = format!("{mp}.ec_connector");
    if EngineKind::of(engine) != EngineKind::Vllm {
        return Err(err(
            path,
            format!(
                "is vLLM's encoder-cache hand-off, and this model's engine is {engine:?}: \
                 remove it (an SGLang language-only prefill calls its own encoders), or set \
                 \"engine\": \"vllm\""
            ),
        ));
    }
    EcConnector::from_name(name).map(Some).ok_or_else(|| {
        err(
            path,
            format!(
                "unknown EC connector {name:?}; expected one of: {}",
                EcConnector::NAMES.join(", ")
            ),
        )
    })
}

fn parse_connector(name: &str, path: &str) -> Result<Connector, ConfigError> {
    Connector::from_name(name).ok_or_else(|| {
        err(
            path,
            format!(
                "unknown KV connector {name:?}; expected one of: {}",
                Connector::NAMES.join(", ")
            ),
        )
    })
}

fn endpoint(spec: EndpointSpec, path: &str) -> Result<Endpoint, ConfigError> {
    // ORIGINAL_DST routes to the header's address without DNS, so only a
    // literal IP:port can work.
    let addr: SocketAddr = spec.address.parse().map_err(|_| {
        err(
            format!("{path}.address"),
            format!(
                "{:?} is not a literal IP:port (host names are not resolved)",
                spec.address
            ),
        )
    })?;
    if addr.port() == 0 {
        return Err(err(format!("{path}.address"), "port must not be 0"));
    }
    if spec.bootstrap_port == Some(0) {
        return Err(err(format!("{path}.bootstrap_port"), "must not be 0"));
    }
    if let Some(r) = spec.prompt_tokens {
        check_range(r, &format!("{path}.prompt_tokens"))?;
    }
    let mut e = Endpoint::new(addr, spec.name);
    e.bootstrap_port = spec.bootstrap_port.unwrap_or(DEFAULT_BOOTSTRAP_PORT);
    e.kv_connector = spec
        .kv_connector
        .as_deref()
        .map(|c| parse_connector(c, &format!("{path}.kv_connector")))
        .transpose()?;
    e.prompt_tokens = spec.prompt_tokens;
    if let Some(dp) = spec.dp_size {
        if dp == 0 {
            return Err(err(format!("{path}.dp_size"), "must be at least 1"));
        }
        e.dp_size = dp;
    }
    if let Some(port) = spec.kv_port {
        if port == 0 {
            return Err(err(format!("{path}.kv_port"), "must not be 0"));
        }
        e.kv_port = port;
    }
    if let Some(n) = spec.nixl_push {
        e.nixl_push = Some(nixl_peer(n, &format!("{path}.nixl_push"))?);
    }
    e.encodes = spec.encodes;
    Ok(e)
}

fn nixl_peer(n: RawNixlPeer, path: &str) -> Result<NixlPeer, ConfigError> {
    if n.engine_id.trim().is_empty() {
        return Err(err(
            format!("{path}.engine_id"),
            "must be the prefill's kv_transfer_config.engine_id",
        ));
    }
    let size = |v: Option<u32>, field: &str| match v {
        Some(0) => Err(err(format!("{path}.{field}"), "must be at least 1")),
        v => Ok(v.unwrap_or(1)),
    };
    if n.side_channel_port == Some(0) {
        return Err(err(format!("{path}.side_channel_port"), "must not be 0"));
    }
    Ok(NixlPeer {
        engine_id: n.engine_id,
        side_channel_host: n.side_channel_host.filter(|h| !h.trim().is_empty()),
        side_channel_port: n
            .side_channel_port
            .unwrap_or(DEFAULT_NIXL_SIDE_CHANNEL_PORT),
        tp_size: size(n.tp_size, "tp_size")?,
        pp_size: size(n.pp_size, "pp_size")?,
    })
}
