//! [`Parts`]: what capabilities keep on a store, one value per type.
//!
//! The store names no capability. A capability keeps what it needs on the
//! store under a type of its own: its backend on a [`Store`](crate::Store)
//! handle (so every capability made from one store shares it), its
//! embedded state on a [`MemoryStore`](crate::MemoryStore) (so every store
//! handle on one embedded store shares that).

use std::any::{Any, TypeId};
use std::sync::{Arc, PoisonError, RwLock};

/// One value per type, made on first use. Looked up when a capability is
/// made or per call of an embedded backend (a read lock and a scan of a few
/// entries), never held across a call.
#[derive(Default)]
pub(crate) struct Parts(RwLock<Vec<(TypeId, Arc<dyn Any + Send + Sync>)>>);

impl Parts {
    /// The value of type `T`, if one was kept.
    pub(crate) fn get<T: Clone + Send + Sync + 'static>(&self) -> Option<T> {
        let parts = self.0.read().unwrap_or_else(PoisonError::into_inner);
        find(&parts)
    }

    /// The value of type `T`, made by `make` and kept if there was none.
    /// Two callers racing both may make one; the first kept wins, so every
    /// caller gets the same value.
    pub(crate) fn get_or_insert_with<T: Clone + Send + Sync + 'static>(
        &self,
        make: impl FnOnce() -> T,
    ) -> T {
        if let Some(value) = self.get() {
            return value;
        }
        let made = make();
        let mut parts = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(value) = find(&parts) {
            return value;
        }
        parts.push((TypeId::of::<T>(), Arc::new(made.clone())));
        made
    }

    /// Keeps `value` as the value of type `T`, in place of any before it.
    pub(crate) fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        let parts = self.0.get_mut().unwrap_or_else(PoisonError::into_inner);
        parts.retain(|(id, _)| *id != TypeId::of::<T>());
        parts.push((TypeId::of::<T>(), Arc::new(value)));
    }
}

fn find<T: Clone + 'static>(parts: &[(TypeId, Arc<dyn Any + Send + Sync>)]) -> Option<T> {
    parts
        .iter()
        .find(|(id, _)| *id == TypeId::of::<T>())
        .and_then(|(_, value)| value.downcast_ref::<T>().cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_value_per_type_made_once() {
        let parts = Parts::default();
        assert_eq!(parts.get::<u32>(), None);
        assert_eq!(parts.get_or_insert_with(|| 7_u32), 7);
        assert_eq!(parts.get_or_insert_with(|| 8_u32), 7);
        assert_eq!(parts.get_or_insert_with(|| "other type"), "other type");
        let mut parts = parts;
        parts.insert(9_u32);
        assert_eq!(parts.get::<u32>(), Some(9));
        assert_eq!(parts.get::<&str>(), Some("other type"));
    }
}
