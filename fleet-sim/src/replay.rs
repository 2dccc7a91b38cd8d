//! `mock-engine replay`: sends a request trace (the Mooncake format: one
//! JSON object a line with `timestamp` in ms, `input_length` and
//! `output_length` in tokens, `hash_ids` of 512-token prefix blocks) at its
//! timestamps, streaming, and records per request what the client saw: the
//! time to the first token, the time to the last, the pods the router named.
//! Times are modelled (real × the time scale), like the simulated pods'.
//!
//! Open loop: a request leaves at its time whether or not earlier ones
//! were answered, as a production service's clients do. `--load` divides
//! the trace's gaps (2 replays it at twice its rate). `--seed` other than 0
//! spreads each request over the second after its timestamp (the Mooncake
//! traces' are whole seconds, a dozen requests on one) and varies the
//! prompts' filler text: a repeat of a run with another seed.

use crate::sim::text::{parse_prompt, prompt_text, splitmix, token_ids, Shape, BLOCK_TOKENS};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// `mock-engine replay`.
#[derive(Parser, Debug)]
#[command(name = "mock-engine replay")]
pub struct ReplayArgs {
    /// The trace (JSON lines)
    #[arg(long)]
    pub trace: PathBuf,
    /// Where to send, http://IP:PORT/PATH; several are taken in turn (one
    /// Service in front of several gateway replicas)
    #[arg(long = "url", required = true)]
    pub urls: Vec<String>,
    /// Modelled seconds per real second (the simulated pods' scale)
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// The trace's rate multiplied by this
    #[arg(long, default_value_t = 1.0)]
    pub load: f64,
    /// Requests skipped from the start of the trace
    #[arg(long, default_value_t = 0)]
    pub skip: usize,
    /// Requests sent (default: the rest of the trace)
    #[arg(long)]
    pub limit: Option<usize>,
    /// The model named in every request
    #[arg(long, default_value = "sim-model")]
    pub model: String,
    /// One JSON line per request is written here
    #[arg(long)]
    pub out: PathBuf,
    /// A request still unanswered after this many real seconds is recorded
    /// as timed out
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
    /// Send each prompt as the token ids a simulated pod's render gives for
    /// its text (a router that keys on token ids then needs no render call)
    #[arg(long)]
    pub token_ids: bool,
    /// Bytes of prompt text per token (the pods' --bytes-per-token)
    #[arg(long, default_value_t = 4)]
    pub bytes_per_token: usize,
    /// 0: arrivals at the trace's timestamps, the default filler; else each
    /// arrival spread over the second after its timestamp and the filler
    /// varied, by this seed (the pods' --seed)
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Send each request's conversation ([`sessions`]) in this header (e.g.
    /// x-session-id); none by default
    #[arg(long)]
    pub session_header: Option<String>,
    /// Each later turn's prompt extends the previous turn's text byte for
    /// byte ([`extended_ids`]), as a chat's next turn does; without it the
    /// trace's own ids give a text that differs from the previous turn's at
    /// its last, partial block
    #[arg(long)]
    pub extend_turns: bool,
}

impl ReplayArgs {
    fn shape(&self) -> Shape {
        Shape {
            bytes_per_token: self.bytes_per_token,
            seed: self.seed,
        }
    }

    /// When request `i` of the replay, at `timestamp` ms, leaves: modelled
    /// seconds after the first request's timestamp.
    fn arrival_s(&self, i: usize, timestamp: f64, first: f64) -> f64 {
        let jitter_ms = if self.seed == 0 {
            0.0
        } else {
            let mut state =
                self.seed ^ ((self.skip + i) as u64).wrapping_mul(0xA24B_AED4_963E_E407);
            (splitmix(&mut state) >> 11) as f64 / (1u64 << 53) as f64 * 1000.0
        };
        (timestamp + jitter_ms - first) / 1000.0 / self.load
    }

    /// The request body of trace line `t` with blocks `ids`, sent as `user`.
    fn body(&self, t: &TraceLine, ids: &[u64], user: &str) -> Bytes {
        let text = prompt_text(ids, t.input_length, self.shape());
        let prompt = if self.token_ids {
            serde_json::json!(token_ids(&parse_prompt(text.as_bytes(), self.shape())))
        } else {
            serde_json::json!(text)
        };
        let body = serde_json::json!({
            "model": self.model,
            "prompt": prompt,
            "max_tokens": t.output_length.max(1),
            "stream": true,
            "user": user,
        });
        Bytes::from(body.to_string())
    }
}

/// One line of a trace.
#[derive(Debug, Clone, Deserialize)]
pub struct TraceLine {
    pub timestamp: f64,
    pub input_length: u32,
    pub output_length: u32,
    pub hash_ids: Vec<u64>,
}

/// What the client saw of one request.
#[derive(Debug, Clone, Serialize)]
pub struct Seen {
    pub user: String,
    pub index: usize,
    /// When the trace says it arrives, modelled seconds after the first.
    pub arrival_s: f64,
    /// How late it left (modelled seconds; the replayer's own lag).
    pub late_s: f64,
    pub url: String,
    /// Its conversation ([`sessions`]: `c` and the index of its first
    /// request), sent or not.
    pub session: String,
    pub status: u16,
    pub ttft_s: Option<f64>,
    pub e2e_s: Option<f64>,
    pub chunks: u32,
    pub output_tokens: u32,
    pub input_tokens: u32,
    pub prefill_pod: Option<String>,
    pub decode_pod: Option<String>,
    pub error: Option<String>,
}

/// The trace from its start to the last request replayed (the requests
/// before `--skip` too: a conversation may have begun there).
fn read_trace(args: &ReplayArgs) -> Result<Vec<TraceLine>, String> {
    let f = std::fs::File::open(&args.trace)
        .map_err(|e| format!("cannot read {}: {e}", args.trace.display()))?;
    let mut out = Vec::new();
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        if args
            .limit
            .is_some_and(|l| out.len() >= args.skip.saturating_add(l))
        {
            break;
        }
        let line = line.map_err(|e| format!("{}: {e}", args.trace.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let t: TraceLine = serde_json::from_str(&line)
            .map_err(|e| format!("{}:{}: {e}", args.trace.display(), n + 1))?;
        out.push(t);
    }
    Ok(out)
}

/// Each request's conversation: the index in the trace of the request that
/// began it. The Mooncake format carries no session id, but a conversation's
/// next turn sends the whole history again, so its `hash_ids` begin with
/// the previous turn's (on the conversation trace the next prompt is the
/// previous prompt and output plus a short message: a median of 26 tokens
/// more). Request `b` continues request `a` (an earlier one) when `b`'s ids
/// begin with `a`'s full blocks (its ids but a last partial one), and those
/// are at least two: a single shared first block is a system prompt, common
/// to unrelated conversations. Of several such `a`, the one with the most
/// blocks, then the latest. Any trace in the format works; one without
/// multi-turn structure gets a session per request.
pub fn sessions(trace: &[TraceLine]) -> Vec<usize> {
    use std::collections::HashMap;
    let mut by_prefix: HashMap<&[u64], usize> = HashMap::new();
    let mut out = Vec::with_capacity(trace.len());
    for (i, t) in trace.iter().enumerate() {
        let ids = t.hash_ids.as_slice();
        let session = (2..=ids.len())
            .rev()
            .find_map(|k| ids.get(..k).and_then(|p| by_prefix.get(p)).copied())
            .unwrap_or(i);
        out.push(session);
        let full = (t.input_length / BLOCK_TOKENS) as usize;
        let prefix = ids.get(..full.min(ids.len())).unwrap_or_default();
        if prefix.len() >= 2 {
            by_prefix.insert(prefix, session);
        }
    }
    out
}

/// Each request's block ids when later turns extend the previous turn's text
/// (`--extend-turns`). The trace gives a turn's last, partial block a new id
/// in the next turn (its content grew), so texts made from the trace's ids
/// differ there and a router's check that the next prompt begins with the
/// last one (pd-router's `kv_reuse`) fails. A later turn longer than its
/// previous turn keeps the previous turn's ids over every block its text
/// covered (the partial one completed) and takes its own from there; its
/// text then begins with the previous turn's. A turn no longer than its
/// previous one keeps the trace's ids.
pub fn extended_ids(trace: &[TraceLine], sessions: &[usize]) -> Vec<Vec<u64>> {
    use std::collections::HashMap;
    // Per conversation: its last turn's ids and prompt tokens.
    let mut last: HashMap<usize, (Vec<u64>, u32)> = HashMap::new();
    let mut out = Vec::with_capacity(trace.len());
    for (i, t) in trace.iter().enumerate() {
        let session = sessions.get(i).copied().unwrap_or(i);
        let ids = match last.get(&session) {
            Some((prev, tokens)) if session != i && t.input_length > *tokens => {
                let covered = tokens.div_ceil(BLOCK_TOKENS) as usize;
                let head = prev.get(..covered.min(prev.len())).unwrap_or_default();
                let tail = t.hash_ids.get(head.len()..).unwrap_or_default();
                [head, tail].concat()
            }
            _ => t.hash_ids.clone(),
        };
        last.insert(session, (ids.clone(), t.input_length));
        out.push(ids);
    }
    out
}

/// `http://IP:PORT/PATH` as an address and a path.
fn split_url(url: &str) -> Result<(SocketAddr, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// URLs"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let addr = host
        .parse()
        .map_err(|_| format!("{url}: the host must be IP:PORT"))?;
    Ok((addr, format!("/{path}")))
}

/// Sends one request and reads its stream; `session`: a header to send
/// (name, value).
async fn one(
    url: String,
    body: Bytes,
    session: Option<(String, String)>,
    scale: f64,
    timeout: Duration,
    seen: &mut Seen,
) {
    let started = Instant::now();
    let result = tokio::time::timeout(timeout, async {
        let (addr, path) = split_url(&url)?;
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header("host", addr.to_string())
            .header("content-type", "application/json");
        if let Some((name, value)) = &session {
            req = req.header(name.as_str(), value.as_str());
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        seen.status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        seen.prefill_pod = header("prefill-target-pod");
        seen.decode_pod = header("decode-target-pod");
        let mut body = resp.into_body();
        let mut tail = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("body: {e}"))?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            let tokens = data.windows(2).filter(|w| w == b"x ").count() as u32;
            if tokens > 0 && seen.ttft_s.is_none() {
                seen.ttft_s = Some(started.elapsed().as_secs_f64() * scale);
            }
            seen.output_tokens += tokens;
            seen.chunks += 1;
            if seen.status >= 400 && tail.len() < 512 {
                tail.extend_from_slice(data);
            }
        }
        seen.e2e_s = Some(started.elapsed().as_secs_f64() * scale);
        if seen.status >= 400 {
            return Err(String::from_utf8_lossy(&tail).into_owned());
        }
        Ok::<(), String>(())
    })
    .await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => seen.error = Some(e),
        Err(_) => seen.error = Some("timed out".into()),
    }
}

/// Replays the trace; one JSON line per request in `--out`, a summary on
/// stderr.
pub async fn run(args: ReplayArgs) -> Result<(), String> {
    if [args.time_scale, args.load]
        .iter()
        .any(|v| v.is_nan() || *v <= 0.0)
    {
        return Err("--time-scale and --load must be above 0".into());
    }
    if args.bytes_per_token == 0 {
        return Err("--bytes-per-token must be at least 1".into());
    }
    for u in &args.urls {
        split_url(u)?;
    }
    let mut trace = read_trace(&args)?;
    let session_of = sessions(&trace);
    let ids_of = if args.extend_turns {
        extended_ids(&trace, &session_of)
    } else {
        Vec::new()
    };
    let trace = trace.split_off(args.skip.min(trace.len()));
    let first = trace.first().map_or(0.0, |t| t.timestamp);
    let start = tokio::time::Instant::now();
    let timeout = Duration::from_secs(args.timeout_s);
    let mut tasks = Vec::with_capacity(trace.len());
    for (i, t) in trace.into_iter().enumerate() {
        let first_turn = session_of.get(args.skip + i).copied();
        let session_id = format!("c{}", first_turn.unwrap_or(args.skip + i));
        let session = args
            .session_header
            .clone()
            .map(|name| (name, session_id.clone()));
        let arrival_s = args.arrival_s(i, t.timestamp, first);
        let url = args
            .urls
            .get(i % args.urls.len())
            .cloned()
            .unwrap_or_default();
        let user = format!("r{}", args.skip + i);
        let ids = ids_of.get(args.skip + i).unwrap_or(&t.hash_ids);
        let body = args.body(&t, ids, &user);
        let scale = args.time_scale;
        let at = start + Duration::from_secs_f64(arrival_s / scale);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let mut seen = Seen {
                user,
                index: i,
                arrival_s,
                late_s: at.elapsed().as_secs_f64() * scale,
                url: url.clone(),
                session: session_id,
                status: 0,
                ttft_s: None,
                e2e_s: None,
                chunks: 0,
                output_tokens: 0,
                input_tokens: t.input_length,
                prefill_pod: None,
                decode_pod: None,
                error: None,
            };
            one(url, body, session, scale, timeout, &mut seen).await;
            seen
        }));
    }
    let mut out = std::fs::File::create(&args.out)
        .map_err(|e| format!("cannot write {}: {e}", args.out.display()))?;
    let (mut ok, mut failed) = (0usize, 0usize);
    for task in tasks {
        let seen = task
            .await
            .map_err(|e| format!("a request task failed: {e}"))?;
        if seen.error.is_none() && seen.status == 200 {
            ok += 1;
        } else {
            failed += 1;
        }
        let line = serde_json::to_string(&seen).map_err(|e| e.to_string())?;
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
    }
    eprintln!(
        "replay: {ok} answered, {failed} failed, {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> ReplayArgs {
        let base = [
            "replay",
            "--trace",
            "t",
            "--url",
            "http://127.0.0.1:1/",
            "--out",
            "o",
        ];
        ReplayArgs::parse_from(base.iter().chain(extra))
    }

    #[test]
    fn a_seed_spreads_each_arrival_over_the_second_after_its_timestamp() {
        let plain = args(&["--load", "2"]);
        assert_eq!(plain.arrival_s(3, 5000.0, 1000.0), 2.0);
        let a = args(&["--load", "2", "--seed", "1"]);
        let b = args(&["--load", "2", "--seed", "2"]);
        let (ta, tb) = (
            a.arrival_s(3, 5000.0, 1000.0),
            b.arrival_s(3, 5000.0, 1000.0),
        );
        assert!(
            (2.0..2.5).contains(&ta) && (2.0..2.5).contains(&tb),
            "{ta} {tb}"
        );
        assert_ne!(ta, tb);
        assert_eq!(
            ta,
            a.arrival_s(3, 5000.0, 1000.0),
            "the same seed, the same run"
        );
        assert_ne!(ta, a.arrival_s(4, 5000.0, 1000.0));
    }

    fn line(input_length: u32, hash_ids: &[u64]) -> TraceLine {
        TraceLine {
            timestamp: 0.0,
            input_length,
            output_length: 1,
            hash_ids: hash_ids.to_vec(),
        }
    }

    #[test]
    fn a_turn_that_begins_with_an_earlier_prompts_full_blocks_continues_its_conversation() {
        let trace = [
            // Two conversations sharing only a system prompt's first block.
            line(1300, &[0, 1, 2]),
            line(1300, &[0, 7, 8]),
            // The first's next turn: its two full blocks, then more.
            line(2100, &[0, 1, 9, 10, 11]),
            // A third turn, continuing the second turn (the longer match).
            line(2700, &[0, 1, 9, 10, 12, 13]),
            // Only the shared first block: a conversation of its own.
            line(900, &[0, 14]),
            // The second's next turn.
            line(1600, &[0, 7, 8, 15]),
            // Its last block was partial: [0, 14] are not both full.
            line(1100, &[0, 14, 16]),
        ];
        assert_eq!(sessions(&trace), vec![0, 1, 0, 0, 4, 1, 6]);
        assert_eq!(sessions(&[]), Vec::<usize>::new());
    }

    #[test]
    fn an_extended_turn_begins_with_the_previous_turns_text() {
        let trace = [
            line(1300, &[0, 1, 2]),
            // The trace renames the partial block 2 (now 3) as it grows.
            line(2100, &[0, 1, 3, 4, 5]),
            line(2700, &[0, 1, 3, 4, 6, 7]),
            // Shorter than its previous turn: the trace's ids.
            line(1200, &[0, 1, 8]),
        ];
        let sessions = sessions(&trace);
        assert_eq!(sessions, vec![0, 0, 0, 0]);
        let ids = extended_ids(&trace, &sessions);
        assert_eq!(
            ids,
            vec![
                vec![0, 1, 2],
                vec![0, 1, 2, 4, 5],
                vec![0, 1, 2, 4, 5, 7],
                vec![0, 1, 8]
            ]
        );
        let text = |i: usize| prompt_text(&ids[i], trace[i].input_length, Shape::default());
        for i in 1..3 {
            assert!(text(i).starts_with(&text(i - 1)), "turn {i}");
        }
        assert!(!prompt_text(&trace[1].hash_ids, 2100, Shape::default()).starts_with(&text(0)));
    }

    #[test]
    fn the_body_carries_text_at_the_asked_bytes_per_token() {
        let t = TraceLine {
            timestamp: 0.0,
            input_length: 700,
            output_length: 3,
            hash_ids: vec![1, 2],
        };
        let body = args(&["--bytes-per-token", "3"]).body(&t, &t.hash_ids, "r0");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["prompt"].as_str().unwrap().len(), 2100);
        assert_eq!(
            (v["max_tokens"].as_u64(), v["user"].as_str()),
            (Some(3), Some("r0"))
        );
    }
}
