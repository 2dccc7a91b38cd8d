//! The simulated fleet and the trace replayer of `mock-engine sim` and
//! `mock-engine replay` (bench/README.md, "Fleet simulation"). The enforcing
//! mocks of one pod each are the binary's own modules (src/main.rs).

pub mod replay;
pub mod sim;
