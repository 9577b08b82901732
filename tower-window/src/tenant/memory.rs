//! The tenant [`Backend`] for [`MemoryStore`]: generations kept on the
//! store, so that registries sharing it never reuse one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::backend::{Backend, Recorded};
use crate::store::{Guard, MemoryStore, Op};

#[derive(Default)]
struct Generations(Mutex<HashMap<String, u64>>);

impl Backend for MemoryStore {
    fn record<'a>(&'a self, _guard: &mut Guard<'a>, change: Recorded<'a>) -> Op<'a, u64> {
        let generations = self.part(|_| Arc::new(Generations::default()));
        let mut generations = crate::sync::lock(&generations.0);
        let generation = generations.entry(change.tenant.to_owned()).or_insert(0);
        if change.change.bumps_generation() {
            *generation += 1;
        }
        Op::ready(Ok(*generation))
    }
}
