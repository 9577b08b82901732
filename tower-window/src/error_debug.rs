//! `Debug` for the crate's public errors: what `?` in `main` prints.
//!
//! A `main` returning `Result<(), Box<dyn Error>>` prints its error as
//! `Error: {:?}`. A derived `Debug` would say `UnknownUnit("x")` where the
//! `Display` text says what is wrong and what was expected, so every public
//! error's `Debug` is its variant's name (what to `match` on) and its
//! `Display` text: `UnknownUnit: unknown duration unit "x": expected ms, s,
//! m, h or d`.

/// Implements `Debug` as `<Variant>: <Display>` for an enum (every variant
/// listed: the match is exhaustive inside the crate, so a new variant
/// cannot be forgotten), or as `<Type>: <Display>` for a struct.
macro_rules! debug_as_display {
    ($type:ident { $($variant:ident),+ $(,)? }) => {
        impl ::std::fmt::Debug for $type {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                let variant = match self {
                    $(Self::$variant { .. } => stringify!($variant),)+
                };
                write!(f, "{variant}: {self}")
            }
        }
    };
    ($type:ident) => {
        impl ::std::fmt::Debug for $type {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, "{}: {self}", stringify!($type))
            }
        }
    };
}

pub(crate) use debug_as_display;
