//! `Bytes`, a byte count that prints for people.

use std::fmt;

/// A byte count that prints for people: `64.0 MiB`, `1.50 GiB`, `512 B`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const KIB: f64 = 1024.0;
        let b = self.0 as f64;
        if self.0 < 1024 {
            write!(f, "{} B", self.0)
        } else if b < KIB * KIB {
            write!(f, "{:.1} KiB", b / KIB)
        } else if b < KIB * KIB * KIB {
            write!(f, "{:.1} MiB", b / (KIB * KIB))
        } else {
            write!(f, "{:.2} GiB", b / (KIB * KIB * KIB))
        }
    }
}
