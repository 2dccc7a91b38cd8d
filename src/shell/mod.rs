//! The only code that talks to Envoy: a root context that owns the validated
//! configuration, and an HTTP context that forwards each callback to the flow.

mod abi;
mod root;
mod shared;
mod stats;
mod stream;
mod streams;

use proxy_wasm::traits::RootContext;

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> { Box::new(root::Root::new(id)) });
}}

#[cfg(test)]
mod tests;
