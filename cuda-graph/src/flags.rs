//! The bit-set API the flag types share ([`InstantiateFlags`](crate::InstantiateFlags),
//! [`StreamFlags`](crate::StreamFlags), [`EventFlags`](crate::EventFlags)).

/// Gives the flag type `$ty`, a tuple struct around its raw bits of type `$bits`, the same
/// bit-set API as every other flag type of the crate: `empty`, `bits`, `from_bits`, `contains`,
/// `is_empty`, `iter`, and `|`, `&`, `|=`, `&=`. The `$flag`s are its single flags (no zero
/// value among them), in the order `iter` yields them.
macro_rules! flag_set {
    ($ty:ident($bits:ty) { $($flag:ident),+ $(,)? }) => {
        impl $ty {
            /// The single flags, in the order [`iter`](Self::iter) yields them.
            const SINGLE: &'static [$ty] = &[$($ty::$flag),+];
            /// Every bit that is one of the single flags.
            const KNOWN: $bits = 0 $(| $ty::$flag.0)+;

            /// No flag set.
            #[must_use]
            pub const fn empty() -> $ty {
                $ty(0)
            }

            /// The raw bits, as the driver takes them.
            #[must_use]
            pub const fn bits(self) -> $bits {
                self.0
            }

            /// The set with these raw bits, or `None` when one of them is not a flag of this
            /// type.
            #[must_use]
            pub const fn from_bits(bits: $bits) -> Option<$ty> {
                if bits & !Self::KNOWN == 0 {
                    Some($ty(bits))
                } else {
                    None
                }
            }

            /// Whether every flag of `other` is set.
            #[must_use]
            pub const fn contains(self, other: $ty) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether no flag is set.
            #[must_use]
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            /// The single flags that are set, one at a time.
            pub fn iter(self) -> impl Iterator<Item = $ty> {
                Self::SINGLE.iter().copied().filter(move |&flag| self.contains(flag))
            }
        }

        impl std::ops::BitOr for $ty {
            type Output = $ty;
            fn bitor(self, rhs: $ty) -> $ty {
                $ty(self.0 | rhs.0)
            }
        }

        impl std::ops::BitOrAssign for $ty {
            fn bitor_assign(&mut self, rhs: $ty) {
                self.0 |= rhs.0;
            }
        }

        impl std::ops::BitAnd for $ty {
            type Output = $ty;
            fn bitand(self, rhs: $ty) -> $ty {
                $ty(self.0 & rhs.0)
            }
        }

        impl std::ops::BitAndAssign for $ty {
            fn bitand_assign(&mut self, rhs: $ty) {
                self.0 &= rhs.0;
            }
        }
    };
}

pub(crate) use flag_set;

#[cfg(test)]
mod tests {
    use crate::{EventFlags, InstantiateFlags, StreamFlags};

    /// The same properties for every flag type: `$single` are its single flags.
    macro_rules! check_flag_set {
        ($ty:ident: $($single:ident),+) => {{
            let single = [$($ty::$single),+];
            let all = single.iter().fold($ty::empty(), |set, &flag| set | flag);
            assert!($ty::empty().is_empty());
            assert_eq!($ty::empty(), $ty::default());
            assert_eq!($ty::empty().iter().count(), 0);
            assert_eq!(all.iter().collect::<Vec<_>>(), single);
            for &flag in &single {
                assert!(!flag.is_empty());
                assert_eq!(flag.bits().count_ones(), 1, "{flag:?} is one bit");
                assert_eq!($ty::from_bits(flag.bits()), Some(flag));
                assert!(all.contains(flag) && flag.contains(flag));
                assert!(flag.contains($ty::empty()));
                assert!(!$ty::empty().contains(flag));
                assert_eq!(all & flag, flag);
                assert_eq!(flag & $ty::empty(), $ty::empty());
                assert_eq!(flag.iter().collect::<Vec<_>>(), [flag]);
                let mut set = $ty::empty();
                set |= flag;
                assert_eq!(set, flag);
                set &= $ty::empty();
                assert!(set.is_empty());
            }
            for (i, &a) in single.iter().enumerate() {
                for &b in &single[i + 1..] {
                    assert_eq!(a & b, $ty::empty());
                    assert_eq!((a | b).iter().collect::<Vec<_>>(), [a, b]);
                    assert!((a | b).contains(a) && !a.contains(a | b));
                }
            }
            assert_eq!($ty::from_bits(all.bits()), Some(all));
            assert_eq!($ty::from_bits(0), Some($ty::empty()));
            // The lowest bit that is no flag, and the highest bit.
            let unknown = !all.bits() & all.bits().wrapping_add(1);
            assert_eq!($ty::from_bits(unknown), None);
            assert_eq!($ty::from_bits(all.bits() | unknown), None);
            assert_eq!($ty::from_bits(!(!0 >> 1)), None);
        }};
    }

    #[test]
    fn flag_types_share_one_bit_set_api() {
        check_flag_set!(InstantiateFlags: AUTO_FREE_ON_LAUNCH, UPLOAD, DEVICE_LAUNCH, USE_NODE_PRIORITY);
        check_flag_set!(StreamFlags: NON_BLOCKING);
        check_flag_set!(EventFlags: BLOCKING_SYNC, DISABLE_TIMING);
    }

    #[test]
    fn flags_keep_their_driver_values() {
        assert_eq!(InstantiateFlags::NONE, InstantiateFlags::empty());
        assert_eq!(StreamFlags::DEFAULT, StreamFlags::empty());
        assert_eq!(EventFlags::DEFAULT, EventFlags::empty());
        let both = InstantiateFlags::AUTO_FREE_ON_LAUNCH | InstantiateFlags::UPLOAD;
        assert_eq!(both.bits(), 0b11);
        assert_eq!(StreamFlags::NON_BLOCKING.bits(), 1);
        assert_eq!(
            (EventFlags::BLOCKING_SYNC | EventFlags::DISABLE_TIMING).bits(),
            0b11
        );
        // CU_EVENT_INTERPROCESS has no flag here: its bit is refused.
        assert_eq!(EventFlags::from_bits(4), None);
    }
}
