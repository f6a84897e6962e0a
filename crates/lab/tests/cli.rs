//! The `ultr-lab` binary (what `ultr experiment` runs): it lists every reproduced experiment, and an
//! unknown one is refused with the exit status of a usage error.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `ultr-lab ARGS`'s output, or a panic after a minute (a `--help` takes milliseconds).
fn lab(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ultr-lab")).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            panic!("ultr-lab {args:?} still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `ultr-lab experiment --help` exits 0 and names each experiment; an unknown experiment exits 2
/// and names itself.
#[test]
fn the_lab_binary_lists_every_experiment_and_refuses_an_unknown_one() {
    let help = lab(&["experiment", "--help"]);
    assert!(help.status.success(), "{}", String::from_utf8_lossy(&help.stderr));
    let text = String::from_utf8_lossy(&help.stdout);
    for name in ["hager2025", "zhang2023", "yan2022", "zhuang2021", "theta-coverage", "propensity-smoothing"] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    let unknown = lab(&["experiment", "no-such-paper"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no-such-paper"));
}
