//! Runnable servers for [`tower_window`].
//!
//! The binaries under `src/bin/` are thin: they parse flags, set up logging
//! and serve what these modules build, so tests can drive the same apps with
//! `tower::ServiceExt::oneshot`.

pub mod ai_proxy;
pub mod audit_export;
pub mod audit_flags;
pub mod gateway;
pub mod grpc;
pub mod inbound;
pub mod process;
pub mod redis_client;
pub mod redis_tls;
pub mod rls;
pub mod store_probe;
