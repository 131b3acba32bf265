//! The files of a client's TLS identity (a CA, a certificate and its key), from flags or from
//! the environment ([`TLS_ENV`]).

use super::*;

/// What a client presents over TLS: the CA that signed the server's certificate, and its
/// own certificate and key (PEM files; the certificate's name says what it is: `admin`,
/// `mount:NAME`, `user:UID[:GID]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// The name the server's certificate must carry (default: the address's host).
    pub domain: Option<String>,
}

/// Environment variables that give [`Client::connect`] its TLS files: the CA of the server's
/// certificate, the client certificate and its key.
pub const TLS_ENV: [&str; 3] = ["CALM_TLS_CA", "CALM_TLS_CERT", "CALM_TLS_KEY"];

impl ClientTls {
    /// The files named by [`TLS_ENV`], when all three are set; an error when only some are.
    pub fn from_env() -> Result<Option<ClientTls>> {
        let [ca, cert, key] = TLS_ENV.map(std::env::var_os);
        match (ca, cert, key) {
            (Some(ca), Some(cert), Some(key)) => Ok(Some(ClientTls {
                ca: ca.into(),
                cert: cert.into(),
                key: key.into(),
                domain: None,
            })),
            (None, None, None) => Ok(None),
            _ => Err(MetaError::Invalid(format!(
                "set all of {} for TLS, or none",
                TLS_ENV.join(", ")
            ))),
        }
    }

    pub(crate) fn config(&self) -> Result<tonic::transport::ClientTlsConfig> {
        let read = |path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| MetaError::Invalid(format!("reading {}: {e}", path.display())))
        };
        let mut config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(read(&self.ca)?))
            .identity(tonic::transport::Identity::from_pem(
                read(&self.cert)?,
                read(&self.key)?,
            ));
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        Ok(config)
    }
}
