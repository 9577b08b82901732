//! The tenant [`Backend`]: where a registry records lifecycle changes and
//! hears of the changes other registries on the same store record.

use std::sync::{Arc, Weak};

use tokio::task::JoinHandle;

use super::registry::{Change, Inner};
use super::ControlConfig;
use crate::store::{Guard, Op};

/// What a store does for tenant registries: record lifecycle changes and,
/// on a store shared by several processes, carry them to every registry.
pub(crate) trait Backend: Send + Sync + 'static {
    /// Records `change` and announces it to every registry on this
    /// backend, atomically; the tenant's generation after it.
    fn record<'a>(&'a self, guard: &mut Guard<'a>, change: Recorded<'a>) -> Op<'a, u64>;

    /// The failure domain of the tenant records, for the store's
    /// per-domain breakers.
    fn failure_domain(&self) -> Option<u16> {
        None
    }

    /// Starts following the changes other registries record into
    /// `registry` until it is gone. `None`: nobody else records any.
    fn follow(
        self: Arc<Self>,
        registry: Weak<Inner>,
        control: ControlConfig,
    ) -> Option<JoinHandle<()>> {
        let _ = (registry, control);
        None
    }
}

/// One lifecycle change for [`Backend::record`].
#[derive(Clone, Copy)]
pub(crate) struct Recorded<'a> {
    pub(crate) tenant: &'a str,
    pub(crate) change: &'a Change,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) control: &'a ControlConfig,
}
