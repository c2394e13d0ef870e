//! What keeps alive everything a graph's nodes refer to, until no launch can use it (the
//! ownership rule of the crate docs' "Safety model").
//!
//! A graph writes into its own [`KeepList`] without a lock (it is built through `&mut`, or
//! through `&self` on one thread). What an executable graph or a user object holds is a
//! [`Kept`]: the list as it was when it was shared, which never changes afterwards, so the
//! graph may go on adding nodes without a lock and without touching what its executable
//! graphs hold.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A value that keeps something a node refers to alive: a module, a buffer's or an
/// allocation's memory, a host function, an event, a child graph's own list.
pub(crate) type Keep = Arc<dyn Any + Send + Sync>;

/// How many of the newest entries a push compares with.
const RECENT: usize = 4;

/// A graph's list: the values added since it was last shared, and what was shared before.
///
/// A value is what it keeps alive, not how often: one the newest few entries already hold (the
/// same object, by address) is not pushed again. Consecutive nodes often name the same module
/// and allocation (an alloc node and its users and free), so the list stays about one entry per
/// object, and is cheaper to grow, search by type and drop.
#[derive(Default)]
pub(crate) struct KeepList {
    fresh: Vec<Keep>,
    shared: Option<Arc<Kept>>,
    /// Whether `fresh` may hold host-visible memory: pushed with
    /// [`push_host`](KeepList::push_host), or in a kept list that may.
    host: bool,
}

/// A shared, frozen part of a [`KeepList`]: its values and the part shared before it.
/// Executable graphs, user objects (`Graph::into_raw`) and parents of child graphs hold one.
pub(crate) struct Kept {
    items: Vec<Keep>,
    earlier: Option<Arc<Kept>>,
    /// Whether it or an earlier part may hold host-visible memory: launches record their uses
    /// in such memory, and a list without any is not searched for it.
    host: bool,
}

impl fmt::Debug for KeepList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeepList({} new values)", self.fresh.len())
    }
}

impl fmt::Debug for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kept({} values)", self.items.len())
    }
}

/// The address an `Arc` points at, without its metadata.
#[inline]
fn address<T: ?Sized>(value: &Arc<T>) -> *const () {
    Arc::as_ptr(value).cast()
}

impl KeepList {
    /// Whether one of the newest entries holds the object at `at`.
    #[inline]
    fn holds_recent(&self, at: *const ()) -> bool {
        let recent = &self.fresh[self.fresh.len().saturating_sub(RECENT)..];
        recent.iter().any(|k| address(k) == at)
    }

    /// Appends `keep` unless one of the newest entries is the same object.
    #[inline]
    pub(crate) fn push(&mut self, keep: Keep) {
        if !self.holds_recent(address(&keep)) {
            self.host |= keep.downcast_ref::<Kept>().is_some_and(|k| k.host);
            self.fresh.push(keep);
        }
    }

    /// Appends host-visible memory (pinned or managed: launches record their uses in it), as
    /// [`push`](KeepList::push).
    #[inline]
    pub(crate) fn push_host(&mut self, keep: Keep) {
        self.host = true;
        self.push(keep);
    }

    /// Appends values of which any may be host-visible memory.
    pub(crate) fn extend_unknown(&mut self, keep: impl IntoIterator<Item = Keep>) {
        for keep in keep {
            self.push_host(keep);
        }
    }

    /// Appends a clone of `value` unless one of the newest entries is the same object: no
    /// reference count is touched for a value the list already holds. Not for host-visible
    /// memory ([`push_host`](KeepList::push_host)).
    #[inline]
    pub(crate) fn push_arc<T: Any + Send + Sync>(&mut self, value: &Arc<T>) {
        if !self.holds_recent(address(value)) {
            self.fresh.push(value.clone() as Keep);
        }
    }

    /// Adds what `other` holds (a capture's or a conditional body's list).
    pub(crate) fn take_from(&mut self, other: &mut KeepList) {
        if let Some(shared) = other.shared.take() {
            self.host |= shared.host;
            self.fresh.push(shared as Keep);
        }
        self.host |= std::mem::take(&mut other.host);
        if self.fresh.is_empty() {
            std::mem::swap(&mut self.fresh, &mut other.fresh);
        } else {
            self.fresh.append(&mut other.fresh);
        }
    }

    /// The list as it is now, frozen: later pushes do not reach it.
    pub(crate) fn share(&mut self) -> Arc<Kept> {
        match &self.shared {
            Some(shared) if self.fresh.is_empty() => shared.clone(),
            _ => {
                let earlier = self.shared.take();
                let kept = Arc::new(Kept {
                    items: std::mem::take(&mut self.fresh),
                    host: std::mem::take(&mut self.host)
                        || earlier.as_ref().is_some_and(|e| e.host),
                    earlier,
                });
                self.shared = Some(kept.clone());
                kept
            }
        }
    }
}

impl Kept {
    /// Whether it may hold host-visible memory (what [`KeepList::push_host`] pushed).
    pub(crate) fn may_hold_host_memory(&self) -> bool {
        self.host
    }

    /// The values that are a `T` (host-visible memory, which launches record their uses in),
    /// cloned, also those of earlier parts and of kept lists held as values.
    pub(crate) fn of_type<T: Any + Send + Sync>(&self) -> Vec<Arc<T>> {
        let mut found = Vec::new();
        self.collect(&mut found);
        found
    }

    fn collect<T: Any + Send + Sync>(&self, found: &mut Vec<Arc<T>>) {
        let mut part = Some(self);
        while let Some(kept) = part {
            collect(&kept.items, found);
            part = kept.earlier.as_deref();
        }
    }
}

/// Pushes onto `found` the values of `items` that are a `T`, looking into kept lists among them.
fn collect<T: Any + Send + Sync>(items: &[Keep], found: &mut Vec<Arc<T>>) {
    for keep in items {
        if let Some(kept) = keep.downcast_ref::<Kept>() {
            kept.collect(found);
        } else if keep.is::<T>() {
            if let Ok(value) = Arc::clone(keep).downcast::<T>() {
                found.push(value);
            }
        }
    }
}

impl Drop for Kept {
    /// Lets go of the earlier parts one after another rather than recursively: a graph shared
    /// after each of many additions makes a long chain.
    fn drop(&mut self) {
        let mut earlier = self.earlier.take();
        while let Some(part) = earlier {
            earlier = match Arc::try_unwrap(part) {
                Ok(mut kept) => kept.earlier.take(),
                Err(_) => None,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Keep, KeepList};
    use std::sync::Arc;

    #[test]
    fn shared_parts_are_frozen_and_found_by_type() {
        let a = Arc::new(1u32);
        let b = Arc::new(2u64);
        let mut list = KeepList::default();
        list.push_arc(&a);
        list.push_arc(&a);
        assert_eq!(
            Arc::strong_count(&a),
            2,
            "a recent value is not pushed again"
        );
        let first = list.share();
        list.push_arc(&b);
        let second = list.share();
        assert_eq!(
            first.of_type::<u64>().len(),
            0,
            "later pushes do not reach a shared part"
        );
        assert_eq!(second.of_type::<u32>().len(), 1);
        assert_eq!(second.of_type::<u64>().len(), 1);
        // Unchanged since: the same part.
        assert!(Arc::ptr_eq(&second, &list.share()));
        // A list held as a value is searched too.
        let mut outer = KeepList::default();
        outer.push(second.clone() as Keep);
        assert_eq!(outer.share().of_type::<u64>().len(), 1);
        drop((list, first, second, outer));
        assert_eq!((Arc::strong_count(&a), Arc::strong_count(&b)), (1, 1));
    }

    #[test]
    fn a_long_chain_drops_without_recursion() {
        let mut list = KeepList::default();
        let value = Arc::new(0u8);
        for _ in 0..200_000 {
            list.push(Arc::new(0u8) as Keep);
            drop(list.share());
        }
        list.push_arc(&value);
        drop(list);
        assert_eq!(Arc::strong_count(&value), 1);
    }
}
