//! The shared-data protocol between worker VMs, checked exhaustively.
//!
//! Envoy runs one VM per worker thread; they share only Envoy's shared data:
//! `get` and `set` with a CAS token, each atomic, with proxy-wasm-cpp-host's
//! rule that a `set` on a key that does not exist yet succeeds whatever its
//! CAS. Each worker below runs the filter's own code (slot leases, load
//! holds and releases, admission reports) on a thread of its own, against a
//! store that lets one `get` or `set` through at a time in the order a
//! schedule says. Every schedule is run (small scope: two or three workers,
//! a few operations each), and each must end with no update lost and no
//! load given back twice.
//!
//! The same explorer runs the protocol the filter used before (one load
//! table per model that every VM CAS-updates) and must find the lost update
//! that made admission let a `batch` request through with two workers.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use pd_router::admission::Entry;
use pd_router::config::Config;
use pd_router::fleet::{ModelId, PodId};
use pd_router::load::HeldLoad;
use pd_router::pods::slots::{ensure_table, lease_slot, SlotTable};
use pd_router::pods::{cas_update, MemoryStore, SetError, SharedStore, WORKER_SLOTS_KEY};
use pd_router::router::Router;
use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

const CONFIG: &str = r#"{"admission":{"max_in_flight_per_pod":8},"models":[{"name":"m","engine":"vllm","rolesets":[{"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}]}]}"#;

/// A worker's program: the filter's calls against a store.
type Program = Box<dyn FnOnce(&mut Stepped) -> Outcome + Send>;

/// A run's choices, each with the workers that could have gone.
type Trace = Vec<(usize, Vec<usize>)>;

/// What a worker reports at its end.
#[derive(Debug, Clone, Default)]
struct Outcome {
    slot: Option<u8>,
    /// It took a place admission control let it in to.
    took: bool,
}

struct State {
    store: MemoryStore,
    /// Workers parked at a host call, waiting for their turn.
    waiting: Vec<bool>,
    done: Vec<bool>,
    turn: Option<usize>,
}

struct Scheduler {
    state: Mutex<State>,
    wake: Condvar,
}

/// A worker's view of the store: every call waits for the worker's turn.
struct Stepped {
    me: usize,
    sched: Arc<Scheduler>,
}

impl Stepped {
    fn step<R>(&self, call: impl FnOnce(&mut MemoryStore) -> R) -> R {
        let mut st = self.sched.state.lock().expect("lock");
        st.waiting[self.me] = true;
        self.sched.wake.notify_all();
        while st.turn != Some(self.me) {
            st = self.sched.wake.wait(st).expect("wait");
        }
        st.turn = None;
        st.waiting[self.me] = false;
        let out = call(&mut st.store);
        self.sched.wake.notify_all();
        out
    }
}

impl SharedStore for Stepped {
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.step(|s| s.shared_get(key))
    }

    fn shared_set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        self.step(|s| s.shared_set(key, value, cas))
    }
}

/// One run: the workers' programs on `store`, scheduled by `prefix` and then
/// by the lowest runnable worker. Returns the choices made, each with the
/// workers that could have gone, the store at the end and the outcomes.
fn run(
    store: MemoryStore,
    programs: Vec<Program>,
    prefix: &[usize],
) -> (Trace, MemoryStore, Vec<Outcome>) {
    let n = programs.len();
    let sched = Arc::new(Scheduler {
        state: Mutex::new(State {
            store,
            waiting: vec![false; n],
            done: vec![false; n],
            turn: None,
        }),
        wake: Condvar::new(),
    });
    let handles: Vec<_> = programs
        .into_iter()
        .enumerate()
        .map(|(me, program)| {
            let sched = Arc::clone(&sched);
            thread::spawn(move || {
                let mut io = Stepped {
                    me,
                    sched: Arc::clone(&sched),
                };
                let out = program(&mut io);
                let mut st = sched.state.lock().expect("lock");
                st.done[me] = true;
                sched.wake.notify_all();
                out
            })
        })
        .collect();
    let mut trace = Vec::new();
    loop {
        let mut st = sched.state.lock().expect("lock");
        while st.turn.is_some() || (0..n).any(|i| !st.done[i] && !st.waiting[i]) {
            st = sched.wake.wait(st).expect("wait");
        }
        let runnable: Vec<usize> = (0..n).filter(|i| st.waiting[*i]).collect();
        if runnable.is_empty() {
            break;
        }
        let pick = prefix
            .get(trace.len())
            .copied()
            .filter(|p| runnable.contains(p))
            .unwrap_or(runnable[0]);
        trace.push((pick, runnable));
        st.turn = Some(pick);
        sched.wake.notify_all();
    }
    let outcomes = handles
        .into_iter()
        .map(|h| h.join().expect("a worker panicked"))
        .collect();
    let store = std::mem::take(&mut sched.state.lock().expect("lock").store);
    (trace, store, outcomes)
}

/// Runs every schedule of the programs `make` builds; `check` judges each
/// run's end and returns what went wrong, if anything. Returns the number
/// of schedules run and the first violation found.
fn explore(
    setup: impl Fn() -> MemoryStore,
    make: impl Fn() -> Vec<Program>,
    check: impl Fn(&MemoryStore, &[Outcome]) -> Option<String>,
) -> (usize, Option<(Vec<usize>, String)>) {
    let mut pending: Vec<Vec<usize>> = vec![Vec::new()];
    let mut runs = 0;
    let mut seen = HashSet::new();
    while let Some(prefix) = pending.pop() {
        let (trace, store, outcomes) = run(setup(), make(), &prefix);
        runs += 1;
        let schedule: Vec<usize> = trace.iter().map(|(p, _)| *p).collect();
        if let Some(why) = check(&store, &outcomes) {
            return (runs, Some((schedule, why)));
        }
        // Every other choice at every step past the prefix is a new run.
        for (i, (pick, runnable)) in trace.iter().enumerate().skip(prefix.len()) {
            for other in runnable.iter().filter(|w| *w != pick) {
                let mut next = schedule[..i].to_vec();
                next.push(*other);
                if seen.insert(next.clone()) {
                    pending.push(next);
                }
            }
        }
    }
    (runs, None)
}

fn config() -> Config {
    Config::parse(CONFIG.as_bytes()).expect("config")
}

fn model_id() -> ModelId {
    config().fleet().models()[0].id
}

fn decode_pod() -> PodId {
    let cfg = config();
    let fleet = cfg.fleet();
    let model = &fleet.models()[0];
    *model.pods.last().expect("a decode pod")
}

fn held() -> HeldLoad {
    HeldLoad {
        model: model_id(),
        prefill: None,
        prefill_tokens: 0,
        decode: Some(decode_pod()),
        streaming: None,
    }
}

/// A worker VM as the filter starts one: it leases a slot, then holds load
/// for `holds` requests and gives back `releases` of them; it publishes its
/// admission queue (one waiting request) if `report`.
fn worker(holder: u64, holds: u32, releases: u32, report: bool) -> Program {
    Box::new(move |io: &mut Stepped| {
        let slot = lease_slot(io, WORKER_SLOTS_KEY, holder, None, 0);
        let router = Router::leased(config(), slot.unwrap_or(0), holder, 0).expect("router");
        for _ in 0..holds {
            router.hold(io, held(), 0).expect("hold");
        }
        for _ in 0..releases {
            router.release(io, held(), None, 0).expect("release");
        }
        if report {
            router.enqueue(
                Entry {
                    context: holder as u32,
                    model: model_id(),
                    adapter: None,
                    prompt_tokens: 1,
                    priority: holder as i32,
                    fairness: String::new(),
                },
                0,
            );
            router.publish_queue(io, 0);
        }
        Outcome { slot, took: false }
    })
}

/// The store as Envoy's configuration canary leaves it: the slot table
/// exists before any worker runs.
fn canary_store() -> MemoryStore {
    let mut s = MemoryStore::default();
    ensure_table(&mut s, WORKER_SLOTS_KEY);
    s
}

/// What a VM that reads now sees of the decode pod's load, over every slot.
fn decodes_seen(store: &MemoryStore) -> u32 {
    let table = SlotTable::decode(store.shared_get(WORKER_SLOTS_KEY).0.as_deref());
    let (slot, holder) = table.live(0).next().expect("a live slot");
    let reader = Router::leased(config(), slot, holder, 0).expect("router");
    reader
        .load(store, model_id())
        .get(decode_pod())
        .pending_decodes
}

fn distinct_slots(outcomes: &[Outcome]) -> Option<String> {
    let slots: Vec<Option<u8>> = outcomes.iter().map(|o| o.slot).collect();
    let unique: HashSet<_> = slots.iter().collect();
    (slots.iter().any(Option::is_none) || unique.len() != slots.len())
        .then(|| format!("slots {slots:?}: two live VMs share one, or one got none"))
}

#[test]
fn two_workers_lose_no_hold_and_release_none_twice_in_any_order() {
    // Worker 1 takes two holds and gives one back; worker 2 takes one.
    let (runs, violation) = explore(
        canary_store,
        || vec![worker(11, 2, 1, false), worker(22, 1, 0, false)],
        |store, outcomes| {
            distinct_slots(outcomes).or_else(|| {
                let seen = decodes_seen(store);
                (seen != 2).then(|| format!("{seen} decodes held, 2 expected"))
            })
        },
    );
    assert_eq!(violation, None, "after {runs} schedules");
    assert!(runs > 100, "the explorer ran {runs} schedules");
    eprintln!("{runs} schedules");
}

#[test]
fn three_workers_lease_distinct_slots_and_see_each_others_load_and_queues() {
    let (runs, violation) = explore(
        canary_store,
        || {
            vec![
                worker(11, 1, 0, false),
                worker(22, 0, 0, true),
                worker(33, 0, 0, false),
            ]
        },
        |store, outcomes| {
            distinct_slots(outcomes).or_else(|| {
                let seen = decodes_seen(store);
                if seen != 1 {
                    return Some(format!("{seen} decodes held, 1 expected"));
                }
                // Worker 11 hears of the others' waiting requests.
                let slot = outcomes[0].slot.expect("slot");
                let r = Router::leased(config(), slot, 11, 0).expect("router");
                r.read_others(store, 0);
                (r.waiting_total() != 1).then(|| {
                    format!(
                        "{} others' requests seen waiting, 1 expected",
                        r.waiting_total()
                    )
                })
            })
        },
    );
    assert_eq!(violation, None, "after {runs} schedules");
    assert!(runs > 500, "the explorer ran {runs} schedules");
    eprintln!("{runs} schedules");
}

/// One free place on the decode pod (`max_in_flight_per_pod` 1). Its
/// shared-data keys are its own (they carry the configuration's
/// fingerprint).
const ONE_PLACE: &str = r#"{"admission":{"max_in_flight_per_pod":1},"models":[{"name":"m","engine":"vllm","rolesets":[{"prefill":["10.0.0.1:8000"],"decode":["10.0.0.2:8000"]}]}]}"#;

/// The store with two workers' slots leased, 0 and 1.
fn two_leased_workers() -> MemoryStore {
    let mut s = canary_store();
    assert_eq!(lease_slot(&mut s, WORKER_SLOTS_KEY, 11, None, 0), Some(0));
    assert_eq!(lease_slot(&mut s, WORKER_SLOTS_KEY, 22, None, 0), Some(1));
    s
}

/// A worker whose look found the decode pod's one place free (both did,
/// the worst case) takes it as admission control does.
fn admitted(slot: u8, holder: u64) -> Program {
    Box::new(move |io: &mut Stepped| {
        let config = Config::parse(ONE_PLACE.as_bytes()).expect("config");
        let router = Router::leased(config, slot, holder, 0).expect("router");
        let took = router.hold_admitted(io, held(), 0).expect("hold");
        Outcome {
            slot: Some(slot),
            took,
        }
    })
}

#[test]
fn two_workers_let_in_for_one_place_never_both_take_it() {
    let (runs, violation) = explore(
        two_leased_workers,
        || vec![admitted(0, 11), admitted(1, 22)],
        |store, outcomes| {
            let took = outcomes.iter().filter(|o| o.took).count();
            let config = Config::parse(ONE_PLACE.as_bytes()).expect("config");
            let reader = Router::leased(config, 0, 11, 0).expect("router");
            let seen = reader
                .load(store, model_id())
                .get(decode_pod())
                .pending_decodes;
            if took > 1 {
                Some(format!("{took} took the one place"))
            } else {
                (seen as usize != took).then(|| format!("{seen} decodes held, {took} took a place"))
            }
        },
    );
    assert_eq!(violation, None, "after {runs} schedules");
    assert!(runs > 20, "the explorer ran {runs} schedules");
    eprintln!("{runs} schedules");
}

#[test]
fn without_the_canarys_table_two_first_leases_can_collide() {
    // Why `on_configure` creates the slot table and why Envoy's canary
    // matters: two VMs that both find it absent both "create" it.
    let (_, violation) = explore(
        MemoryStore::default,
        || vec![worker(11, 0, 0, false), worker(22, 0, 0, false)],
        |_, outcomes| distinct_slots(outcomes),
    );
    assert!(violation.is_some(), "the explorer finds the collision");
}

#[test]
fn the_former_shared_table_loses_a_hold_when_two_workers_create_it() {
    // The protocol the filter used before: one table per model that every
    // VM updates with CAS. Both workers read it absent, and the second
    // "create" overwrites the first.
    let add_one = || -> Program {
        Box::new(|io: &mut Stepped| {
            let decode = |b: Option<&[u8]>| b.map_or(0, |b| b.len());
            let encode = |n: &usize| vec![0; *n];
            cas_update(io, "load", decode, encode, |n| *n += 1).expect("update");
            Outcome::default()
        })
    };
    let (_, violation) = explore(
        MemoryStore::default,
        || vec![add_one(), add_one()],
        |store, _| {
            let n = store.shared_get("load").0.map_or(0, |b| b.len());
            (n != 2).then(|| format!("{n} holds recorded, 2 taken"))
        },
    );
    let (schedule, why) = violation.expect("the explorer finds the lost update");
    assert_eq!(why, "1 holds recorded, 2 taken");
    assert_eq!(
        schedule,
        vec![0, 1, 0, 1],
        "both read it absent, both create it"
    );
}
