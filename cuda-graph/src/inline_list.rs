//! [`Few`]: a short list that usually needs no heap allocation, for a node record's
//! dependencies, uses and memory operations (most nodes have one of each). Building a graph
//! makes thousands of these; a `Vec` allocates for each.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// A list that keeps a single item inline and moves to a `Vec` at the second. Reads as a slice
/// (`Deref<Target = [T]>`).
#[derive(Clone, Default)]
pub enum Few<T> {
    /// No items.
    #[default]
    Empty,
    /// One item, inline.
    One(T),
    /// Two or more.
    Many(Vec<T>),
}

impl<T> Few<T> {
    /// An empty list.
    #[must_use]
    pub const fn new() -> Few<T> {
        Few::Empty
    }

    /// Appends an item. The first is stored inline here; the move to the heap is out of line.
    #[inline(always)]
    pub fn push(&mut self, item: T) {
        match self {
            Few::Empty => *self = Few::One(item),
            _ => self.push_more(item),
        }
    }

    /// [`push`](Few::push) onto one or more items.
    #[inline(never)]
    fn push_more(&mut self, item: T) {
        match self {
            Few::Empty => *self = Few::One(item),
            Few::Many(items) => items.push(item),
            Few::One(_) => {
                if let Few::One(first) = std::mem::take(self) {
                    *self = Few::Many(vec![first, item]);
                }
            }
        }
    }

    /// The items.
    #[inline]
    #[must_use]
    pub fn as_slice(&self) -> &[T] {
        match self {
            Few::Empty => &[],
            Few::One(item) => std::slice::from_ref(item),
            Few::Many(items) => items,
        }
    }
}

impl<T> Deref for Few<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T> DerefMut for Few<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Few::Empty => &mut [],
            Few::One(item) => std::slice::from_mut(item),
            Few::Many(items) => items,
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for Few<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl<T> From<Vec<T>> for Few<T> {
    fn from(mut items: Vec<T>) -> Few<T> {
        match items.len() {
            0 => Few::Empty,
            1 => items.pop().map_or(Few::Empty, Few::One),
            _ => Few::Many(items),
        }
    }
}

impl<T> FromIterator<T> for Few<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Few<T> {
        let mut few = Few::Empty;
        few.extend(iter);
        few
    }
}

impl<T> Extend<T> for Few<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        for item in iter {
            self.push(item);
        }
    }
}

impl<'a, T> IntoIterator for &'a Few<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl<T: PartialEq> PartialEq for Few<T> {
    fn eq(&self, other: &Few<T>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<T: Eq> Eq for Few<T> {}

impl<T: PartialEq> PartialEq<Vec<T>> for Few<T> {
    fn eq(&self, other: &Vec<T>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<T: PartialEq> PartialEq<[T]> for Few<T> {
    fn eq(&self, other: &[T]) -> bool {
        self.as_slice() == other
    }
}

#[cfg(test)]
mod tests {
    use super::Few;

    #[test]
    fn grows_from_inline_to_vec() {
        let mut few = Few::new();
        assert!(few.is_empty());
        few.push(1);
        assert!(matches!(few, Few::One(1)));
        few.push(2);
        few.push(3);
        assert_eq!(few, vec![1, 2, 3]);
        assert_eq!(few.len(), 3);
        assert!(few.contains(&2));
        assert_eq!(format!("{few:?}"), "[1, 2, 3]");
        let collected: Few<u32> = (0..1).collect();
        assert!(matches!(collected, Few::One(0)));
        assert_eq!(Few::from(vec![7, 8]).as_slice(), &[7, 8]);
        assert!(matches!(Few::from(vec![9]), Few::One(9)));
        assert!(matches!(Few::<u8>::from(Vec::new()), Few::Empty));
    }
}
