//! The tenant [`Backend`] for [`MemoryStore`]: the
//! tenants' state generations, kept on the store so that every registry on
//! one embedded store moves a tenant to a generation none of them used.
//! There is no one else to tell: nothing to follow.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::backend::{Backend, Recorded};
use crate::store::{Guard, MemoryStore, Op};

/// The tenants' state generations of one embedded store.
#[derive(Default)]
struct Generations(Mutex<HashMap<String, u64>>);

impl Backend for MemoryStore {
    fn record<'a>(&'a self, _guard: &mut Guard<'a>, change: Recorded<'a>) -> Op<'a, u64> {
        let generations = self.part(|_| Arc::new(Generations::default()));
        let mut generations = generations.0.lock().unwrap_or_else(PoisonError::into_inner);
        let generation = generations.entry(change.tenant.to_owned()).or_insert(0);
        if change.change.bumps_generation() {
            *generation += 1;
        }
        Op::ready(Ok(*generation))
    }
}
