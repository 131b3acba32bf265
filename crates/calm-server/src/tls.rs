//! TLS for TCP listeners: the server's certificate, client certificates required and checked
//! against the client CA (rustls), the client's name read from its certificate's common name,
//! and the making of a CA and certificates for `calm certs`.
//!
//! A client certificate's common name says what the client is (`docs/design/security.md`):
//! `admin` (an administrator, acting for any uid), `mount:NAME` (a trusted mount, acting for
//! the uids of its kernel's callers), `user:UID` or `user:UID:GID` (one user).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A TLS listener's configuration.
#[derive(Clone)]
pub struct TlsServer {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsServer")
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(path)?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
    let certs = certs.map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(&read(path)?).map_err(|e| format!("{}: {e}", path.display()))
}

impl TlsServer {
    /// The server's certificate chain and key, and the CA that signs client certificates
    /// (PEM files). Clients without a certificate of that CA are refused in the handshake.
    pub fn new(cert: &Path, key_file: &Path, client_ca: &Path) -> Result<TlsServer, String> {
        let mut roots = rustls::RootCertStore::empty();
        for ca in certs(client_ca)? {
            roots
                .add(ca)
                .map_err(|e| format!("{}: {e}", client_ca.display()))?;
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
            .build()
            .map_err(|e| format!("client CA {}: {e}", client_ca.display()))?;
        let config = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs(cert)?, key(key_file)?)
            .map_err(|e| format!("{}: {e}", cert.display()))?;
        let mut config = config;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(TlsServer {
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// The handshake, and the name the client's certificate gives it.
    pub async fn accept(
        &self,
        stream: TcpStream,
    ) -> std::io::Result<(TlsStream<TcpStream>, String)> {
        let tls = self.acceptor.accept(stream).await?;
        let name = {
            let (_, session) = tls.get_ref();
            let cert = session
                .peer_certificates()
                .and_then(|c| c.first())
                .ok_or_else(|| std::io::Error::other("no client certificate"))?;
            common_name(cert)
                .ok_or_else(|| std::io::Error::other("the client certificate has no common name"))?
        };
        Ok((tls, name))
    }
}

/// The subject's common name of a DER certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// Files `calm certs` writes: the CA, and one certificate and key per name.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca-key.pem";

/// How long certificates made by `calm certs` are valid, in days.
pub const VALID_DAYS: i64 = 825;

/// Writes `text` into a new file `path` with `mode` (`crate::private_file`): never through a
/// link or into a file someone planted there.
fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    use std::io::Write;
    let failed = |e: std::io::Error| format!("writing {}: {e}", path.display());
    let mut file = crate::private_file::PrivateFile::with_mode(path, mode).map_err(failed)?;
    file.file().write_all(text.as_bytes()).map_err(failed)?;
    file.persist().map_err(failed)?;
    Ok(())
}

fn write_private(path: &Path, text: &str) -> Result<(), String> {
    write_new(path, text, 0o600)
}

fn validity(params: &mut rcgen::CertificateParams, days: i64) {
    let now = std::time::SystemTime::now();
    params.not_before = (now - std::time::Duration::from_secs(3600)).into();
    params.not_after = if days >= 0 {
        now + std::time::Duration::from_secs(days as u64 * 86_400)
    } else {
        now - std::time::Duration::from_secs(days.unsigned_abs() * 86_400)
    }
    .into();
}

/// Makes a CA in `dir` (`ca.pem`, `ca-key.pem`, the key 0600).
pub fn make_ca(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "calm CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    validity(&mut params, VALID_DAYS);
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    write_new(&dir.join(CA_CERT), &cert.pem(), 0o644)?;
    write_private(&dir.join(CA_KEY), &key.serialize_pem())
}

/// Issues a certificate named `name` (its common name) signed by the CA in `dir`, written as
/// `FILE.pem` and `FILE-key.pem` (`FILE` is `name` with `:` as `-`). `hosts`: the names and
/// addresses a server certificate is valid for (none for a client certificate);
/// `valid_days` may be negative (an expired certificate, for tests).
pub fn issue(
    dir: &Path,
    name: &str,
    hosts: &[String],
    valid_days: i64,
) -> Result<(std::path::PathBuf, std::path::PathBuf), String> {
    let ca_key_pem = std::fs::read_to_string(dir.join(CA_KEY))
        .map_err(|e| format!("reading {}: {e}", dir.join(CA_KEY).display()))?;
    let ca_key = rcgen::KeyPair::from_pem(&ca_key_pem).map_err(|e| e.to_string())?;
    let ca_pem = std::fs::read_to_string(dir.join(CA_CERT))
        .map_err(|e| format!("reading {}: {e}", dir.join(CA_CERT).display()))?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(|e| e.to_string())?;
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = rcgen::CertificateParams::new(hosts.to_vec()).map_err(|e| e.to_string())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.extended_key_usages = if hosts.is_empty() {
        vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth]
    } else {
        vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth]
    };
    validity(&mut params, valid_days);
    let cert = params.signed_by(&key, &issuer).map_err(|e| e.to_string())?;
    let file = name.replace([':', '/'], "-");
    let cert_path = dir.join(format!("{file}.pem"));
    let key_path = dir.join(format!("{file}-key.pem"));
    write_new(&cert_path, &cert.pem(), 0o644)?;
    write_private(&key_path, &key.serialize_pem())?;
    Ok((cert_path, key_path))
}
