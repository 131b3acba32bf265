//! TLS: clients with good and bad certificates, a mount over TLS with root squashed, and
//! the etcd store over TLS with etcd users.

use std::path::Path;
use std::process::Command;

use super::lines;
use crate::common::{self, CALM, Mount, calm};

/// Certificates made with `calm certs` (and an expired one, and one of another CA).
fn certificates(dir: &Path) {
    let dir_s = dir.to_str().expect("utf-8");
    for args in [
        vec!["certs", "init", "--dir", dir_s],
        vec![
            "certs",
            "issue",
            "server",
            "--dir",
            dir_s,
            "--host",
            "127.0.0.1",
        ],
        vec!["certs", "issue", "admin", "--dir", dir_s],
        vec!["certs", "issue", "user:4242", "--dir", dir_s],
    ] {
        let out = calm(&args);
        assert!(out.status.success(), "calm {args:?}: {out:?}");
    }
    let expired = dir.join("expired");
    std::fs::create_dir(&expired).expect("mkdir");
    for name in ["ca.pem", "ca-key.pem"] {
        std::fs::copy(dir.join(name), expired.join(name)).expect("copy");
    }
    calm_server::tls::issue(&expired, "admin", &[], -1).expect("an expired certificate");
    let other = dir.join("other-ca");
    calm_server::tls::make_ca(&other).expect("another CA");
    calm_server::tls::issue(&other, "admin", &[], 30).expect("a certificate of another CA");
}

/// `calm serve` on `data` with a TLS listener on loopback, the certificates of `certs`.
fn tls_server(data: &Path, certs: &Path, extra: &[&str]) -> common::Server {
    let c = |name: &str| certs.join(name).to_string_lossy().into_owned();
    let (cert, key, ca) = (c("server.pem"), c("server-key.pem"), c("ca.pem"));
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ];
    args.extend(["--tls-client-ca", &ca]);
    args.extend(extra);
    common::Server::start_with(data, &args)
}

#[test]
fn tls_clients_need_a_certificate_of_the_client_ca() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let certs = tmp.path().join("certs");
    certificates(&certs);
    let c = |name: &str| certs.join(name).to_string_lossy().into_owned();
    let server = tls_server(&tmp.path().join("data"), &certs, &[]);
    let status = |cert: Option<(&str, &str)>, args: &[&str]| {
        let mut command = Command::new(CALM);
        command.args(args).args(["--server", &server.addr]);
        if let Some((cert, key)) = cert {
            command
                .env("CALM_TLS_CA", c("ca.pem"))
                .env("CALM_TLS_CERT", cert)
                .env("CALM_TLS_KEY", key);
        }
        command.output().expect("calm")
    };
    let admin = (c("admin.pem"), c("admin-key.pem"));
    let ok = status(Some((&admin.0, &admin.1)), &["status"]);
    assert!(ok.status.success(), "an admin certificate: {ok:?}");
    let user = (c("user-4242.pem"), c("user-4242-key.pem"));
    let out = status(Some((&user.0, &user.1)), &["status"]);
    assert!(out.status.success(), "a user certificate: {out:?}");
    let out = status(
        Some((&user.0, &user.1)),
        &["changelog", "register", "--name", "x"],
    );
    assert!(
        !out.status.success(),
        "a user registered a changelog reader"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs an administrator"),
        "{out:?}"
    );
    let refused = [
        ("no certificate", None),
        (
            "an expired certificate",
            Some((c("expired/admin.pem"), c("expired/admin-key.pem"))),
        ),
        (
            "a certificate of another CA",
            Some((c("other-ca/admin.pem"), c("other-ca/admin-key.pem"))),
        ),
    ];
    for (what, cert) in refused {
        let out = match &cert {
            Some((cert, key)) => status(Some((cert, key)), &["status"]),
            None => status(None, &["status"]),
        };
        assert!(!out.status.success(), "{what} was let in: {out:?}");
    }
    // The server still serves.
    assert!(
        status(Some((&admin.0, &admin.1)), &["status"])
            .status
            .success()
    );

    // Without TLS, a listener beyond loopback is refused with the reason.
    let out = Command::new(CALM)
        .args(["serve", "--data"])
        .arg(tmp.path().join("data2"))
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .expect("calm serve");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs TLS"),
        "{out:?}"
    );
}

/// One etcd member speaking TLS only, with client certificates required; killed when dropped.
struct TlsEtcd {
    child: std::process::Child,
    endpoint: String,
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn the_etcd_store_speaks_tls_with_a_client_certificate_and_etcd_users() {
    use calm_store::{ReadTxn, Store, WriteTxn};
    let tmp = tempfile::tempdir().expect("tempdir");
    let certs = tmp.path().join("certs");
    certificates(&certs);
    let c = |name: &str| certs.join(name).to_string_lossy().into_owned();
    let (client, peer) = (free_port(), free_port());
    let endpoint = format!("https://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let log = std::fs::File::create(tmp.path().join("etcd.log")).expect("log");
    let etcd = TlsEtcd {
        child: Command::new("etcd")
            .args(["--name", "m0", "--data-dir"])
            .arg(tmp.path().join("etcd"))
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("m0={peer_url}")])
            .args([
                "--cert-file",
                &c("server.pem"),
                "--key-file",
                &c("server-key.pem"),
            ])
            .args(["--client-cert-auth", "--trusted-ca-file", &c("ca.pem")])
            .args(["--log-level", "warn"])
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("etcd"),
        endpoint,
    };
    let etcdctl = |args: &[&str]| {
        let mut last = None;
        // The member may still be starting.
        for _ in 0..100 {
            let out = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &etcd.endpoint, "--cacert", &c("ca.pem")])
                .args(["--cert", &c("admin.pem"), "--key", &c("admin-key.pem")])
                .args(["--user", "root:rootpw"])
                .args(args)
                .output()
                .expect("etcdctl");
            if out.status.success() {
                return;
            }
            last = Some(out);
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("etcdctl {args:?}: {last:?}");
    };
    // Users: root (to administer), and calm, which may read and write under its prefix only.
    etcdctl(&["user", "add", "root:rootpw"]);
    etcdctl(&["user", "grant-role", "root", "root"]);
    etcdctl(&["user", "add", "calm:calmpw"]);
    etcdctl(&["role", "add", "calm"]);
    etcdctl(&[
        "role",
        "grant-permission",
        "calm",
        "--prefix=true",
        "readwrite",
        "sec",
    ]);
    etcdctl(&["user", "grant-role", "calm", "calm"]);
    etcdctl(&["auth", "enable"]);
    std::fs::write(tmp.path().join("pw"), "calmpw\n").expect("password file");
    std::fs::write(tmp.path().join("bad"), "nope\n").expect("password file");
    let hosts = etcd.endpoint.trim_start_matches("https://");
    let url = |prefix: &str, query: &str| {
        format!(
            "etcd+https://{hosts}/{prefix}?retry-ms-max=2000&tls-ca={}{query}",
            c("ca.pem")
        )
    };
    let with_cert = format!(
        "&tls-cert={}&tls-key={}",
        c("user-4242.pem"),
        c("user-4242-key.pem")
    );
    let password = |file: &str| {
        format!(
            "&user=calm&password-file={}",
            tmp.path().join(file).display()
        )
    };
    let connect = |url: &str| {
        let options = calm_store_etcd::EtcdOptions::from_url(url).expect("a good URL");
        calm_store_etcd::EtcdStore::connect(options)
    };

    // TLS, a client certificate, the right password: the store works.
    let store = connect(&url("sec", &format!("{with_cert}{}", password("pw"))))
        .expect("connecting with TLS and a password");
    let mut txn = store.begin().expect("begin");
    txn.put(b"k", b"v").expect("put");
    txn.commit().expect("commit over TLS");
    assert_eq!(
        store
            .snapshot()
            .expect("snapshot")
            .get(b"k")
            .expect("get")
            .as_deref(),
        Some(&b"v"[..])
    );
    drop(store);

    // A wrong password, no password, no client certificate, a prefix the user may not
    // write, or plain HTTP: refused.
    let attempts = [
        (
            "a wrong password",
            url("sec", &format!("{with_cert}{}", password("bad"))),
        ),
        ("no password", url("sec", &with_cert)),
        ("no client certificate", url("sec", &password("pw"))),
        (
            "another prefix",
            url("other", &format!("{with_cert}{}", password("pw"))),
        ),
    ];
    for (what, url) in attempts {
        let refused = connect(&url).and_then(|store| {
            let mut txn = store.begin()?;
            txn.put(b"k", b"intruder")?;
            txn.commit()
        });
        eprintln!("{what}: {refused:?}");
        assert!(refused.is_err(), "{what} was let in");
    }
    let plain = format!("etcd://{hosts}/sec?retry-ms-max=2000");
    assert!(connect(&plain).is_err(), "plain HTTP was let in");
    // Passwords stay out of URLs and of debug output.
    let options = calm_store_etcd::EtcdOptions::from_url(&url("sec", &password("pw"))).unwrap();
    assert!(!format!("{options:?}").contains("calmpw"));
    let error = calm_store_etcd::EtcdOptions::from_url(&format!(
        "etcd://{hosts}/sec?tls-ca={}",
        c("ca.pem")
    ))
    .unwrap_err();
    assert!(error.contains("etcd+https://"), "{error}");
}

#[test]
fn a_mount_over_tls_acts_for_its_callers_with_root_squashed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let certs = tmp.path().join("certs");
    certificates(&certs);
    let out = calm(&[
        "certs",
        "issue",
        "mount:node1",
        "--dir",
        certs.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let c = |name: &str| certs.join(name).to_string_lossy().into_owned();
    let data = tmp.path().join("data");
    let server = tls_server(&data, &certs, &["--root-squash"]);
    let socket = format!("unix:{}", data.join("calm.sock").display());
    // Root's mount over the Unix socket is an administrator: root stays root.
    let local = Mount::remote(&socket, &[]);
    local.sh_ok(
        "echo secret > root600 && chmod 600 root600 && mkdir open && chmod 777 open
         echo theirs > user600 && chown 4321:4321 user600 && chmod 600 user600",
    );
    // The mount with a mount:NAME certificate: its root acts as nobody.
    let remote = Mount::remote(
        &server.addr,
        &[
            "--tls-ca",
            &c("ca.pem"),
            "--tls-client-cert",
            &c("mount-node1.pem"),
            "--tls-client-key",
            &c("mount-node1-key.pem"),
            "--allow-other",
        ],
    );
    let out = remote.sh_ok(
        "cat root600 2>/dev/null && echo read || echo refused
         echo mine > open/new && stat -c '%u %g' open/new
         chmod 777 root600 2>/dev/null && echo chmodded || echo refused",
    );
    assert_eq!(lines(&out), ["refused", "65534 65534", "refused"], "{out}");
    // A file the squashed root makes is not held by its mount (which would answer root's
    // chown itself): the chown is refused when it is made, not at the close.
    let out = remote.sh_ok(
        "python3 -c \"
import os
fd = os.open('open/h', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
try:
    os.fchown(fd, 1234, 1234)
    print('chowned')
except PermissionError:
    print('refused')
os.close(fd)
print('closed')
\"",
    );
    assert_eq!(lines(&out), ["refused", "closed"], "{out}");
    // A file its owner read through the mount (twice: a mount keeps copies of files it read)
    // is still refused to the squashed root, whom the kernel alone would let in: the mount
    // keeps no copy whose opens would bypass the server.
    let out = remote.sh_ok(
        "setpriv --reuid 4321 --regid 4321 --clear-groups cat user600
         setpriv --reuid 4321 --regid 4321 --clear-groups cat user600
         cat user600 2>/dev/null && echo read || echo refused",
    );
    assert_eq!(lines(&out), ["theirs", "theirs", "refused"], "{out}");
    assert_eq!(
        local.sh_ok("cat root600; stat -c %a root600"),
        "secret\n600\n"
    );
}
