//! The tests' Kafka-protocol broker: tansu 0.6's command line (`ultr-test-broker broker
//! --listener-url … --storage-engine memory://tansu/`), a workspace member built in the same
//! `--workspace` build as ultr. Not part of ultr; scripts/test.sh starts it and the tests that need a broker
//! of their own spawn it.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    // tansu's tracing (RUST_LOG), as its own binary sets it up.
    let _tracing = match tansu_broker::otel::init(tansu_broker::TracingFormat::Text) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("ultr-test-broker: tracing: {e}");
            return ExitCode::FAILURE;
        }
    };
    match tansu_cli::Cli::main().await {
        Ok(tansu_sans_io::ErrorCode::None) => ExitCode::SUCCESS,
        Ok(code) => {
            eprintln!("ultr-test-broker: {code}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("ultr-test-broker: {e}");
            ExitCode::FAILURE
        }
    }
}
