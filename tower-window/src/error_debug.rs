//! `Debug` for the crate's public errors, which `?` in `main` prints: the
//! variant's name and the `Display` text (`UnknownUnit: unknown duration
//! unit "x": expected ms, s, m, h or d`), not a derived `UnknownUnit("x")`.

/// Implements `Debug` as `<Variant>: <Display>` for an enum (every variant
/// listed, so none is forgotten), or `<Type>: <Display>` for a struct.
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
