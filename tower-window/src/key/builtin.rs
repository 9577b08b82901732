//! Built-in extractors (placeholder).

/// Header placeholder.
#[derive(Debug, Clone)]
pub struct Header;
/// Query placeholder.
#[derive(Debug, Clone)]
pub struct Query;
/// Extension placeholder.
#[derive(Debug, Clone)]
pub struct Extension;
/// PeerIp placeholder.
#[derive(Debug, Clone)]
pub struct PeerIp;
/// TrustedProxies placeholder.
#[derive(Debug, Clone)]
pub struct TrustedProxies;
/// Constant placeholder.
#[derive(Debug, Clone)]
pub struct Constant;
