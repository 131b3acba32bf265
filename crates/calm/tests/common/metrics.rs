//! Reading a metrics endpoint in tests: `GET` over HTTP/1.1 and promtool's check.

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};

/// `GET path` on `addr` (HOST:PORT); the body of a 200 answer.
pub fn http_get(addr: &str, path: &str) -> String {
    let (head, body) = http_answer(addr, path).expect("an answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body
}

/// `GET path` on `addr`: the body when the answer is a 200, `None` when there is no answer
/// (nothing listens yet) or another status (a server still starting answers 503).
pub fn http_get_when_ready(addr: &str, path: &str) -> Option<String> {
    let (head, body) = http_answer(addr, path)?;
    head.starts_with("HTTP/1.1 200").then_some(body)
}

/// `GET path` on `addr`: the answer's head and body.
fn http_answer(addr: &str, path: &str) -> Option<(String, String)> {
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    Some((head.to_string(), body.to_string()))
}

/// `promtool check metrics` of `text` (Debian's prometheus package, which `scripts/setup`
/// installs).
pub fn promtool_check_metrics(text: &str) -> Output {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/setup installs prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// A TCP port on loopback free now (for a metrics endpoint).
pub fn free_port() -> u16 {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    socket.local_addr().expect("addr").port()
}

/// The value of the sample `series` (name and labels exactly) in `text`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}
