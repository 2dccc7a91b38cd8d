//! fleet-sim: the simulated fleet and the trace replayer behind
//! `mock-engine sim` and `mock-engine replay` (bench/README.md, "Fleet
//! simulation"). A library of its own: the mock-engine binary only parses
//! the subcommand and runs it here; the enforcing mocks of one pod each
//! live in mock-engine/, and nothing here imports them.

pub mod replay;
pub mod sim;
