//! [`Parts`]: what capabilities keep on a store under a type of their own,
//! so the store names no capability.

use std::any::{Any, TypeId};
use std::sync::{Arc, PoisonError, RwLock};

/// One value per type, made on first use; looked up per call of an
/// embedded backend (a read lock and a scan of a few entries).
#[derive(Debug, Default)]
pub(crate) struct Parts(RwLock<Vec<(TypeId, Arc<dyn Any + Send + Sync>)>>);

impl Parts {
    pub(crate) fn get<T: Clone + Send + Sync + 'static>(&self) -> Option<T> {
        let parts = self.0.read().unwrap_or_else(PoisonError::into_inner);
        find(&parts)
    }

    /// The value of type `T`, made by `make` if there was none (of racing
    /// callers, the first to keep one wins).
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

    /// Keeps `value` in place of any value of type `T`.
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
