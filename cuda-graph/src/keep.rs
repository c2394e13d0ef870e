//! What keeps alive everything a graph's nodes refer to, until no launch can use it (the
//! ownership rule of the crate docs' "Safety model").

use std::fmt;
use std::sync::{Arc, Mutex};

/// A value that keeps something a node refers to alive: a module, a buffer's or an
/// allocation's memory, a host function, an event, a child graph's own list.
pub(crate) type Keep = Arc<dyn std::any::Any + Send + Sync>;

/// Everything a graph's nodes refer to. The graph holds it, and so does every executable graph
/// made from it, whose drop lets go of it only once its last launch is done
/// ([`crate::ExecGraph`]). A graph handed over with [`crate::Graph::into_raw`] retains a CUDA
/// user object that holds it, released by the driver; that destructor, on a driver thread,
/// only queues the release of its share ([`crate::deferred`]).
///
/// A value is what it keeps alive, not how often: one the newest few entries already hold (the
/// same object, by address) is not pushed again. Consecutive nodes often name the same module
/// and allocation (an alloc node and its users and free), so the list stays about one entry per
/// object, and is cheaper to grow, search by type and drop.
#[derive(Default)]
pub(crate) struct KeepList(Mutex<Vec<Keep>>);

/// How many of the newest entries a push compares with.
const RECENT: usize = 4;

/// Appends `keep` to `list` unless one of its [`RECENT`] newest entries is the same object.
#[inline]
fn push_new(list: &mut Vec<Keep>, keep: Keep) {
    let recent = &list[list.len().saturating_sub(RECENT)..];
    if !recent.iter().any(|k| Arc::ptr_eq(k, &keep)) {
        list.push(keep);
    }
}

impl fmt::Debug for KeepList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeepList({} values)", self.lock().len())
    }
}

impl KeepList {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Keep>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push(&self, keep: Keep) {
        push_new(&mut self.lock(), keep);
    }

    pub(crate) fn extend(&self, keep: impl IntoIterator<Item = Keep>) {
        let mut list = self.lock();
        for keep in keep {
            push_new(&mut list, keep);
        }
    }

    /// Moves the values of `other` into this list.
    pub(crate) fn take_from(&self, other: &KeepList) {
        let taken = std::mem::take(&mut *other.lock());
        self.lock().extend(taken);
    }

    /// The values that are a `T`, cloned (an executable graph's host-visible memory, which it
    /// records its launches in).
    pub(crate) fn of_type<T: std::any::Any + Send + Sync>(&self) -> Vec<Arc<T>> {
        self.lock()
            .iter()
            .filter(|keep| (***keep).is::<T>())
            .filter_map(|keep| Arc::clone(keep).downcast::<T>().ok())
            .collect()
    }

    /// The values, cloned.
    pub(crate) fn snapshot(&self) -> Vec<Keep> {
        self.lock().clone()
    }
}
