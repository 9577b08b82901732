//! [`ControlConfig`]: how a registry keeps its records and control stream.

use std::time::Duration;

/// How a registry records lifecycle changes on a shared store (Redis) and
/// follows the ones other registries record: see the [module docs](super).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ControlConfig {
    /// Approximate length the control stream is trimmed to (`MAXLEN ~`).
    pub max_len: u64,
    /// TTL of the records, generations and stream, refreshed by every
    /// change and every node's load (default 30 days).
    pub ttl: Duration,
    /// How long one `XREAD` blocks (default 500 ms; an entry ends it at once).
    pub block: Duration,
    /// The time budget of a lifecycle call of a
    /// [`TenantRegistry::redis`](super::TenantRegistry) (default 2 s).
    pub timeout: Duration,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            max_len: 1000,
            ttl: Duration::from_secs(30 * 24 * 3600),
            block: Duration::from_millis(500),
            timeout: Duration::from_secs(2),
        }
    }
}

impl ControlConfig {
    /// Sets [`max_len`](Self::max_len).
    #[must_use]
    pub fn max_len(mut self, max_len: u64) -> Self {
        self.max_len = max_len;
        self
    }

    /// Sets [`ttl`](Self::ttl).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets [`block`](Self::block).
    #[must_use]
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// Sets [`timeout`](Self::timeout).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}
