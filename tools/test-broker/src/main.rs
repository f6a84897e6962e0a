//! The tests' SASL/SCRAM- and sqlite-capable Kafka-protocol broker: tansu 0.6's broker with libsql
//! storage, started as `ultr-test-broker broker --listener-url … --advertised-listener-url …
//! --storage-engine sqlite://broker.db [--authentication] [--silent]` (the flags of tansu's own
//! command line, so `tansu broker` serves the tests too). Not part of ultr; `tests/common/brokers.rs`
//! spawns it for the tests that need storage that survives a restart or SCRAM users.

use std::process::ExitCode;

use tansu_broker::broker::Broker;
use tansu_broker::coordinator::group::administrator::Controller;
use tansu_storage::StorageContainer;
use url::Url;

/// The command line: the `broker` subcommand and the flags the tests pass.
#[derive(Debug, PartialEq)]
struct Args {
    listener: Url,
    advertised: Url,
    storage: Url,
    authentication: bool,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        Some("broker") => {}
        other => return Err(format!("expected the `broker` command, got {other:?}")),
    }
    let url = |flag: &str, value: Option<&String>| -> Result<Url, String> {
        let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
        Url::parse(value).map_err(|e| format!("{flag} {value}: {e}"))
    };
    let (mut listener, mut advertised, mut storage, mut authentication) = (None, None, None, false);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--listener-url" => listener = Some(url(flag, it.next())?),
            "--advertised-listener-url" => advertised = Some(url(flag, it.next())?),
            "--storage-engine" => storage = Some(url(flag, it.next())?),
            "--authentication" => authentication = true,
            "--silent" => {}
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let listener = listener.ok_or("--listener-url is required")?;
    Ok(Args {
        advertised: advertised.unwrap_or_else(|| listener.clone()),
        listener,
        storage: storage.ok_or("--storage-engine is required")?,
        authentication,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&args) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("ultr-test-broker: {e}\nusage: ultr-test-broker broker --listener-url URL [--advertised-listener-url URL] --storage-engine sqlite://FILE [--authentication] [--silent]");
            return ExitCode::from(2);
        }
    };
    match serve(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ultr-test-broker: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Builds the broker and serves until it stops; any error, or a non-`None` error code, as text.
async fn serve(args: Args) -> Result<(), String> {
    let started = tokio::time::Instant::now();
    let broker = Broker::<Controller<StorageContainer>, StorageContainer>::builder()
        .node_id(tansu_broker::NODE_ID)
        .cluster_id("tansu_cluster")
        .incarnation_id(uuid::Uuid::now_v7())
        .advertised_listener(args.advertised)
        .storage(args.storage)
        .listener(args.listener)
        .authentication(args.authentication)
        .silent(true)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    match broker.main(started).await.map_err(|e| e.to_string())? {
        tansu_sans_io::ErrorCode::None => Ok(()),
        code => Err(code.to_string()),
    }
}
