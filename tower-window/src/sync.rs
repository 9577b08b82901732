//! Locking that survives a panic elsewhere.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking a poisoned lock as it is.
///
/// Every state the crate keeps behind a `Mutex` is consistent after each
/// statement, so a panic while another thread held the lock leaves nothing
/// half-written; turning the poison into a panic of every later caller
/// would only spread the first one.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
