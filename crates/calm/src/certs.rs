//! `calm certs`: a CA, and the certificates of TLS listeners and their clients.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::anyhow;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum Certs {
    /// Make a CA in DIR (ca.pem, and ca-key.pem readable by this user alone).
    Init {
        #[arg(long, default_value = "./calm-certs")]
        dir: PathBuf,
    },
    /// Issue a certificate signed by DIR's CA: a server's (with --host, once per name or
    /// address it is reached by) or a client's, named admin, mount:NAME or user:UID[:GID].
    /// Writes NAME.pem and NAME-key.pem (':' written as '-').
    Issue {
        /// The certificate's name.
        name: String,
        #[arg(long, default_value = "./calm-certs")]
        dir: PathBuf,
        /// A host name or address the server is reached by (makes a server certificate).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = calm_server::tls::VALID_DAYS)]
        days: i64,
    },
}

pub fn run(command: Certs) -> anyhow::Result<ExitCode> {
    match command {
        Certs::Init { dir } => {
            if dir.join(calm_server::tls::CA_KEY).exists() {
                anyhow::bail!(
                    "{} already holds a CA (certificates it signed would stop working if it \
                     were replaced)",
                    dir.display()
                );
            }
            calm_server::tls::make_ca(&dir).map_err(|e| anyhow!(e))?;
            println!("CA made in {}", dir.display());
        }
        Certs::Issue {
            name,
            dir,
            hosts,
            days,
        } => {
            if days <= 0 {
                anyhow::bail!("--days must be positive");
            }
            if hosts.is_empty() {
                calm_server::auth::Auth::check_client_name(&name).map_err(|e| anyhow!(e))?;
            }
            let (cert, key) =
                calm_server::tls::issue(&dir, &name, &hosts, days).map_err(|e| anyhow!(e))?;
            println!("{} {}", cert.display(), key.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
