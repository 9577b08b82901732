//! TLS to Redis (feature `tls`, rustls): `rediss://` URLs verified against
//! the system's roots or a CA given with `RedisTls`, with an optional client
//! certificate. An ACL user and password go in the URL either way.

use redis::cluster::ClusterClientBuilder;
use redis::{Client, ConnectionInfo, RedisResult};

/// The TLS settings a [`RedisStoreBuilder`](super::RedisStoreBuilder) was
/// given (none without the `tls` feature).
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    #[cfg(feature = "tls")]
    certificates: Option<redis::TlsCertificates>,
}

impl TlsSettings {
    pub(crate) fn client(&self, info: ConnectionInfo) -> RedisResult<Client> {
        #[cfg(feature = "tls")]
        if let Some(certificates) = &self.certificates {
            return Client::build_with_tls(info, certificates.clone());
        }
        Client::open(info)
    }

    /// `info` carrying the settings, for a connection made from it alone.
    pub(crate) fn node(&self, info: ConnectionInfo) -> RedisResult<ConnectionInfo> {
        #[cfg(feature = "tls")]
        if self.certificates.is_some() {
            return Ok(self.client(info)?.get_connection_info().clone());
        }
        Ok(info)
    }

    pub(crate) fn cluster(&self, builder: ClusterClientBuilder) -> ClusterClientBuilder {
        #[cfg(feature = "tls")]
        if let Some(certificates) = &self.certificates {
            return builder.certs(certificates.clone());
        }
        builder
    }
}

#[cfg(feature = "tls")]
pub use with_tls::{RedisTls, RedisTlsError};

#[cfg(feature = "tls")]
mod with_tls {
    use std::path::{Path, PathBuf};

    use redis::{ClientTlsConfig, TlsCertificates};

    use super::super::RedisStoreBuilder;
    use super::TlsSettings;

    /// The CA a `rediss://` store trusts (default: the system's roots) and
    /// an optional client certificate (mutual TLS), for every node; given
    /// to [`RedisStoreBuilder::tls`].
    ///
    /// ```no_run
    /// use tower_window::store::redis::RedisTls;
    /// use tower_window::RedisStore;
    ///
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let tls = RedisTls::new()
    ///     .ca_file("/etc/redis/ca.crt")?
    ///     .client_cert_files("/etc/redis/client.crt", "/etc/redis/client.key")?;
    /// let store = RedisStore::builder()
    ///     .url("rediss://app:secret@redis.internal:6380")
    ///     .tls(tls)
    ///     .build()?;
    /// # let _ = store; Ok(()) }
    /// ```
    #[derive(Clone, Default)]
    pub struct RedisTls {
        ca: Option<Vec<u8>>,
        client: Option<(Vec<u8>, Vec<u8>)>,
    }

    impl RedisTls {
        /// The system's root certificates, no client certificate.
        pub fn new() -> Self {
            Self::default()
        }

        /// Trusts the CA certificate(s) in `pem`.
        pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
            self.ca = Some(pem.into());
            self
        }

        /// Trusts the CA certificate(s) in the PEM file at `path`.
        pub fn ca_file(self, path: impl AsRef<Path>) -> Result<Self, RedisTlsError> {
            Ok(self.ca_pem(read(path.as_ref())?))
        }

        /// Presents the client certificate (chain) `cert` with its private
        /// key `key`, both PEM.
        pub fn client_cert_pem(
            mut self,
            cert: impl Into<Vec<u8>>,
            key: impl Into<Vec<u8>>,
        ) -> Self {
            self.client = Some((cert.into(), key.into()));
            self
        }

        /// Presents the client certificate in the PEM file `cert` with the
        /// private key in the PEM file `key`.
        pub fn client_cert_files(
            self,
            cert: impl AsRef<Path>,
            key: impl AsRef<Path>,
        ) -> Result<Self, RedisTlsError> {
            let cert = read(cert.as_ref())?;
            let key = read(key.as_ref())?;
            Ok(self.client_cert_pem(cert, key))
        }
    }

    impl std::fmt::Debug for RedisTls {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            // Never the key's bytes.
            f.debug_struct("RedisTls")
                .field(
                    "ca",
                    &if self.ca.is_some() {
                        "given"
                    } else {
                        "system roots"
                    },
                )
                .field("client_cert", &self.client.is_some())
                .finish()
        }
    }

    /// A certificate or key file of [`RedisTls`] could not be read.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot read {}: {source}", path.display())]
    pub struct RedisTlsError {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    }

    impl RedisTlsError {
        /// The file that could not be read.
        pub fn path(&self) -> &Path {
            &self.path
        }
    }

    fn read(path: &Path) -> Result<Vec<u8>, RedisTlsError> {
        std::fs::read(path).map_err(|source| RedisTlsError {
            path: path.to_owned(),
            source,
        })
    }

    impl RedisStoreBuilder {
        /// Uses `tls` for the `rediss://` server or every cluster node;
        /// [`build`](Self::build) refuses it with a `redis://` URL.
        pub fn tls(mut self, tls: RedisTls) -> Self {
            self.tls = TlsSettings {
                certificates: Some(TlsCertificates {
                    client_tls: tls.client.map(|(client_cert, client_key)| ClientTlsConfig {
                        client_cert,
                        client_key,
                    }),
                    root_cert: tls.ca,
                }),
            };
            self
        }
    }
}
