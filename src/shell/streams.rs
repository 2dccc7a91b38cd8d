//! This VM's streams, reachable from the root context. Admission control
//! resumes a waiting stream from the root's tick, with the host calls
//! pointed at that stream (`proxy_set_effective_context`). A call the
//! stream makes then is registered by the SDK under the root context, so
//! its answer comes to the root, which hands it back to the stream here.
//! Envoy defers what a stream's host calls start (resuming, a local reply)
//! until the VM call returns, so driving a stream never re-enters it.

use super::abi;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};

/// Generic over the stream's state, so this file needs nothing of
/// `stream.rs` (which holds one).
pub(super) struct Streams<C> {
    by_context: RefCell<HashMap<u32, Weak<RefCell<C>>>>,
    /// Calls made while the root drove a stream: token → its context.
    calls: RefCell<HashMap<u32, u32>>,
    /// The stream the root drives now.
    driving: Cell<Option<u32>>,
}

impl<C> Default for Streams<C> {
    fn default() -> Self {
        Streams {
            by_context: RefCell::default(),
            calls: RefCell::default(),
            driving: Cell::default(),
        }
    }
}

impl<C> Streams<C> {
    pub(super) fn add(&self, context: u32, core: &Rc<RefCell<C>>) {
        self.by_context
            .borrow_mut()
            .insert(context, Rc::downgrade(core));
    }

    pub(super) fn remove(&self, context: u32) {
        self.by_context.borrow_mut().remove(&context);
        // Envoy cancels a gone stream's calls: their answers never come.
        self.calls.borrow_mut().retain(|_, c| *c != context);
    }

    /// A stream made a call: when the root drives it, the answer comes to
    /// the root.
    pub(super) fn dispatched(&self, token: u32) {
        if let Some(context) = self.driving.get() {
            self.calls.borrow_mut().insert(token, context);
        }
    }

    /// The stream a call answered at the root belongs to.
    pub(super) fn owner_of_call(&self, token: u32) -> Option<u32> {
        self.calls.borrow_mut().remove(&token)
    }

    /// Runs `f` on stream `context` with the host calls acting on it, then
    /// points them back at the root context `root`. `None` (nothing ran)
    /// for a stream that is gone.
    pub(super) fn drive<T>(
        &self,
        context: u32,
        root: u32,
        f: impl FnOnce(&mut C) -> T,
    ) -> Option<T> {
        let core = self
            .by_context
            .borrow()
            .get(&context)
            .and_then(Weak::upgrade)?;
        abi::set_effective_context(context).ok()?;
        self.driving.set(Some(context));
        // A stream callback running now would hold it; the root never runs
        // inside one, so this only guards against a host that did.
        let out = core.try_borrow_mut().ok().map(|mut core| f(&mut core));
        self.driving.set(None);
        let _ = abi::set_effective_context(root);
        out
    }
}
