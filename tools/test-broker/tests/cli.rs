//! The broker binary the deployment tests spawn is built (an integration test makes `cargo test
//! --workspace` build its package's binary) and answers its command line.

#[test]
fn the_broker_binary_offers_its_broker_command() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ultr-test-broker")).arg("--help").output().expect("ultr-test-broker runs");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(help.lines().any(|l| l.trim_start().starts_with("broker")), "no broker command in:\n{help}");
}
