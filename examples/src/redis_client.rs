//! Redis clients of the examples' own (the gateway's inbound stream, the
//! inbound worker), with `TCP_NODELAY` as the store's connections have it.

use tower_window::store::redis::redis::io::tcp::TcpSettings;
use tower_window::store::redis::redis::{Client, IntoConnectionInfo, RedisResult};

/// A client for `url` whose connections set `TCP_NODELAY`: redis-rs leaves
/// Nagle's algorithm on, and a small command written while an earlier one
/// is unacknowledged could wait for the peer's delayed ACK (about 40 ms).
pub fn no_delay_client(url: &str) -> RedisResult<Client> {
    let info = url
        .into_connection_info()?
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    Client::open(info)
}
