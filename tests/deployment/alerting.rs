//! The shipped alert rules, evaluated by a real Prometheus server scraping real `ultr run`
//! processes, in the three deployment shapes: (a) `ultr run pipelines/demo.toml`, (b) one instance
//! on a real broker, (c) two instances in one consumer group over the S3 server with the compactor
//! lease. A healthy deployment started fresh (no model, no closed window) must stay silent for longer
//! than the rules' longest `for:` plus their longest range; each fault must fire its own alert and
//! only the alerts it should.
//!
//! Time is compressed uniformly: `ultr rules-time-scale` divides every duration of
//! `pipelines/alerts.yml` by the factor, and the service runs with windows and schedules divided by
//! the same factor. The demo streams 200× faster than wall time (its 5-minute windows close every
//! 1.5 s), so its runs use factor 200; the Kafka shapes use 120 (1-hour windows of 30 s).
//!
//! Each scenario prints `ALERTING <scenario>: <alert> <state> after <s> s` lines: the fault matrix.

use crate::common;
use crate::common::OutputWithin;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::brokers::{tansu, wait_for_port, Guard};
use common::{free_port, http_get};
use ultr::simulate::relevance::RelevanceKind;
use ultr::simulate::{PolicyConfig, SimConfig, Simulator, SyntheticData};
use ultr::sinks::kafka::{ensure_topic, KafkaSink};
use ultr::sinks::SessionSink;

/// The demo's own compression: 0.1 s of event time per session at 2,000 sessions/s.
const DEMO_FACTOR: f64 = 200.0;
/// The Kafka shapes: an hour of rules time is 30 s (a 5-minute rate spans 10 scrapes and a few
/// checkpoints, whose 1 s interval is not scaled).
const KAFKA_FACTOR: f64 = 120.0;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn unique(name: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// The longest `for:` plus the longest range of the shipped rules, in seconds of rules time: how
/// long a healthy deployment must stay silent.
fn quiet_horizon_s() -> f64 {
    let (_, found) = ultr::monitor::rules_time::scale_rules(&std::fs::read_to_string(repo().join("pipelines/alerts.yml")).unwrap(), 1.0).unwrap();
    let longest = |kind: &str| found.iter().filter(|f| f.kind == kind).map(|f| f.seconds).fold(0.0, f64::max);
    longest("for") + longest("range")
}

/// A Prometheus server with the shipped rules scaled by `factor`, scraping `targets` every `scrape`.
struct Prometheus {
    _guard: Guard,
    addr: String,
    log: PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, factor: f64, targets: &[String], scrape: &str) -> Prometheus {
        Prometheus::start_evaluating(dir, factor, targets, scrape, scrape)
    }

    /// As `start`, with rules evaluated every `evaluation` (shorter than the scrape interval, whose
    /// timeout may not exceed it on a loaded machine).
    fn start_evaluating(dir: &Path, factor: f64, targets: &[String], scrape: &str, evaluation: &str) -> Prometheus {
        std::fs::create_dir_all(dir).unwrap();
        let rules = dir.join("alerts.yml");
        let out = Command::new(env!("CARGO_BIN_EXE_ultr"))
            .arg("rules-time-scale")
            .arg(repo().join("pipelines/alerts.yml"))
            .args(["--factor", &factor.to_string(), "--out"])
            .arg(&rules)
            .output_within(crate::common::CHILD_DEADLINE)
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let quoted: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {scrape}\n  scrape_timeout: {scrape}\n  evaluation_interval: {evaluation}\nrule_files:\n  - {:?}\nscrape_configs:\n  - job_name: ultr\n    static_configs:\n      - targets: [{}]\n",
                rules.display(),
                quoted.join(", ")
            ),
        )
        .unwrap();
        let port = free_port();
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("prometheus (Debian package `prometheus`, installed by the README's test command) on PATH");
        let guard = Guard(child);
        wait_for_port(port, "prometheus", &log);
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get(&addr, "/-/ready").map(|(c, _)| c).ok() != Some(200) {
            assert!(Instant::now() < deadline, "prometheus not ready: {}", std::fs::read_to_string(&log).unwrap_or_default());
            std::thread::sleep(Duration::from_millis(200));
        }
        Prometheus { _guard: guard, addr, log }
    }

    fn api(&self, path: &str) -> serde_json::Value {
        let (code, body) = http_get(&self.addr, path).unwrap();
        assert_eq!(code, 200, "{path}: {body}\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    /// The result vector of an instant query.
    fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let encoded: String =
            expr.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect();
        self.api(&format!("/api/v1/query?query={encoded}"))["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The timestamp (Prometheus' clock, seconds since the epoch) of the oldest sample of `series`
    /// in the last 10 minutes, None when it has none.
    fn first_sample_at(&self, series: &str) -> Option<f64> {
        self.query(&format!("{series}[10m]")).iter().filter_map(|s| s["values"][0][0].as_f64()).reduce(f64::min)
    }

    /// The sum of an instant query's values (None when it returns no series).
    fn value(&self, expr: &str) -> Option<f64> {
        let r = self.query(expr);
        (!r.is_empty()).then(|| r.iter().filter_map(|s| s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok())).sum())
    }

    /// Active alerts as (name, state).
    fn alerts(&self) -> Vec<(String, String)> {
        self.api("/api/v1/alerts")["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (a["labels"]["alertname"].as_str().unwrap().to_string(), a["state"].as_str().unwrap().to_string()))
            .collect()
    }
}

/// When each (alert, state) was first seen, in seconds since the watch began.
#[derive(Default, Debug)]
struct Seen(BTreeMap<(String, String), f64>);

impl Seen {
    fn firing(&self) -> Vec<String> {
        self.0.keys().filter(|(_, s)| s == "firing").map(|(a, _)| a.clone()).collect()
    }

    fn fired_after(&self, alert: &str) -> Option<f64> {
        self.0.get(&(alert.to_string(), "firing".to_string())).copied()
    }

    fn report(&self, scenario: &str) {
        if self.0.is_empty() {
            eprintln!("ALERTING {scenario}: no alert pending or firing");
        }
        for ((alert, state), at) in &self.0 {
            eprintln!("ALERTING {scenario}: {alert} {state} after {at:.1} s");
        }
    }
}

/// Polls the alerts for up to `limit`, until `until` (when given) fires.
fn watch(prom: &Prometheus, limit: Duration, until: Option<&str>) -> Seen {
    watch_on(prom, limit, until, Duration::ZERO)
}

/// As `watch`, and then `after` longer once `until` fired: whatever else the fault fires shows.
fn watch_on(prom: &Prometheus, limit: Duration, until: Option<&str>, after: Duration) -> Seen {
    let started = Instant::now();
    let mut seen = Seen::default();
    let mut end = started + limit;
    while Instant::now() < end {
        for key in prom.alerts() {
            seen.0.entry(key).or_insert(started.elapsed().as_secs_f64());
        }
        if let Some(at) = until.and_then(|a| seen.fired_after(a)) {
            end = end.min(started + Duration::from_secs_f64(at) + after);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    seen
}

/// A running `ultr run` (killed when dropped) and its HTTP address.
struct Instance {
    guard: Guard,
    addr: String,
    log: PathBuf,
}

impl Instance {
    /// Starts `ultr run` listening on `addr` (Prometheus may scrape it before it is up: the
    /// rules then see the deployment from its first sample).
    fn start(config: &Path, dir: &Path, name: &str, addr: &str) -> Instance {
        let state = dir.join(format!("{name}-state"));
        let log = dir.join(format!("{name}.log"));
        let addr = addr.to_string();
        let child = Command::new(env!("CARGO_BIN_EXE_ultr"))
            .arg("run")
            .arg(config)
            .arg("--state")
            .arg(&state)
            .args(["--listen", addr.as_str()])
            .current_dir(dir)
            .env("ULTR_LOG", "warn,ultr::story=info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting ultr run");
        let guard = Guard(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while http_get(&addr, "/metrics").map(|(c, _)| c).ok() != Some(200) {
            assert!(Instant::now() < deadline, "{name} did not serve /metrics: {}", tail(&log));
            std::thread::sleep(Duration::from_millis(200));
        }
        Instance { guard, addr, log }
    }

    fn healthz(&self) -> u16 {
        http_get(&self.addr, "/healthz").map(|(c, _)| c).unwrap_or(0)
    }
}

fn local_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// The dashboard's queries; each must return a series in at least one healthy shape.
fn dashboard_queries() -> Vec<String> {
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(repo().join("pipelines/grafana-dashboard.json")).unwrap()).unwrap();
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_string()))
        .collect()
}

/// The metric families a running instance serves now (its `/metrics`' `# TYPE` lines): what a
/// process exports, read off the process, not off the registry's code.
fn served_names(addr: &str) -> BTreeSet<String> {
    let (code, body) = http_get(addr, "/metrics").unwrap();
    assert_eq!(code, 200, "{body}");
    body.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect()
}

/// Every metric name the shipped alert rules and the dashboard query (histograms by family).
fn queried_names() -> BTreeSet<String> {
    let rules = crate::deploy::yaml(&repo().join("pipelines/alerts.yml"));
    let exprs = rules["groups"][0]["rules"].as_sequence().unwrap().iter().map(|r| r["expr"].as_str().unwrap().to_string());
    exprs.chain(dashboard_queries()).flat_map(|e| crate::deploy::metric_names_in(&e)).collect()
}

/// The metrics the rules and the dashboard query that a healthy simulator demo does not serve, and
/// the test whose instance must serve each: a Kafka source's (`single_instance_…`, after its
/// malformed burst) and the judged evaluation's (`a_model_ranking_below_…`, with qrels).
const KAFKA_ONLY: [&str; 3] = ["ultr_bad_records_total", "ultr_kafka_consumer_lag_messages", "ultr_source_up"];
const JUDGED_ONLY: [&str; 1] = ["ultr_judged_ndcg_difference"];

/// The dashboard queries that returned at least one series now.
fn answered(prom: &Prometheus) -> Vec<String> {
    dashboard_queries().into_iter().filter(|q| !prom.query(q).is_empty()).collect()
}

/// The demo config with `edit` applied to its text (the demo's own compression holds).
fn demo_variant(dir: &Path, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let text = edit(std::fs::read_to_string(repo().join("pipelines/demo.toml")).unwrap());
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// (a) `ultr run pipelines/demo.toml`, as shipped: silent from a fresh start through its first
/// trainings and scored windows, longer than the longest `for:` plus the longest range.
#[test]
fn demo_shape_is_silent_when_healthy_and_its_dashboard_answers() {
    let dir = tempfile::tempdir().unwrap();
    let addr = local_addr();
    let prom = Prometheus::start(&dir.path().join("prometheus"), DEMO_FACTOR, std::slice::from_ref(&addr), "250ms");
    let ultr = Instance::start(&repo().join("pipelines/demo.toml"), dir.path(), "demo", &addr);
    let horizon = quiet_horizon_s() / DEMO_FACTOR;
    // Past the horizon and past the first scored window under a promoted model.
    let started = Instant::now();
    let mut seen = Seen::default();
    while started.elapsed().as_secs_f64() < horizon + 5.0 || prom.value("ultr_residual_windows_total").unwrap_or(0.0) < 3.0 {
        assert!(started.elapsed() < Duration::from_secs(240), "no scored window under a model: {}", tail(&ultr.log));
        let more = watch(&prom, Duration::from_secs(2), None);
        for (k, at) in more.0 {
            seen.0.entry(k).or_insert(at + started.elapsed().as_secs_f64());
        }
    }
    seen.report("demo healthy");
    eprintln!("ALERTING demo healthy: watched {:.0} s (quiet horizon {horizon:.1} s)", started.elapsed().as_secs_f64());
    assert!(seen.firing().is_empty(), "a healthy demo fired {:?}\n{}", seen.firing(), tail(&ultr.log));
    // The simulator has no connection: no `ultr_source_up` to page on.
    assert_eq!(prom.value("ultr_source_up"), None);
    assert_eq!(ultr.healthz(), 200);
    let answered = answered(&prom);
    let kafka_only = ["ultr_kafka_consumer_lag_messages", "ultr_bad_records_total"];
    let missing: Vec<String> = dashboard_queries().into_iter().filter(|q| !answered.contains(q) && !kafka_only.iter().any(|k| q.contains(k))).collect();
    assert!(missing.is_empty(), "dashboard queries without a series on the healthy demo: {missing:?}");
    // Every metric the rules and the dashboard query is served by this process, but for those two
    // other tests' instances must serve.
    let served = served_names(&ultr.addr);
    let unserved: Vec<String> =
        queried_names().into_iter().filter(|n| !served.contains(n) && !KAFKA_ONLY.contains(&n.as_str()) && !JUDGED_ONLY.contains(&n.as_str())).collect();
    assert!(unserved.is_empty(), "the rules or the dashboard query metrics the demo does not serve: {unserved:?}\nserved: {served:?}");
}

/// A producer writing simulated sessions at `rate` per second with event time = now (plus, while
/// `garbage` is set, one malformed record per 10 sessions), until dropped. It starts at least
/// `FIRST_WINDOW_LEAD` before the end of the 30-second window it starts in.
struct Producer {
    stop: Arc<AtomicBool>,
    garbage: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// A stream that starts in the last moments of a window gives that window a handful of sessions,
/// which identify nothing: the instance then rightly reports NOT IDENTIFIED until the next window
/// closes, 30 s later, longer than `IdentifiabilityLost`'s `for:` divided by `KAFKA_FACTOR` (7.5 s),
/// and a "healthy" start fires it (seen once in CI: 9 sessions in the first window). A healthy
/// stream's first window holds at least 5 s of sessions (2,000 at 400/s).
const FIRST_WINDOW_LEAD: Duration = Duration::from_secs(5);

impl Producer {
    fn start(brokers: &str, topic: &str, rate: u64) -> Producer {
        let window = Duration::from_secs(30);
        let into = Duration::from_millis((SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() % window.as_millis()) as u64);
        if window - into < FIRST_WINDOW_LEAD {
            std::thread::sleep(window - into);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let garbage = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (brokers, topic, s, g, n) = (brokers.to_string(), topic.to_string(), stop.clone(), garbage.clone(), sent.clone());
        let handle = std::thread::spawn(move || {
            let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
            let sim = Simulator::new(SimConfig {
                synthetic: SyntheticData { queries: 60, docs_per_query: 8, features: 3 },
                relevance: RelevanceKind::Linear,
                policy: PolicyConfig { tau: 0.3, ..PolicyConfig::default() },
                sessions: u64::MAX / 2,
                seed: 91,
                start_ms: now_ms,
                interval_ms: (1000 / rate as i64).max(1),
                ..SimConfig::default()
            })
            .unwrap();
            let properties = [("linger.ms".to_string(), "20".to_string())].into_iter().collect();
            let mut sink = KafkaSink::new(&brokers, &topic, &properties).unwrap();
            let started = Instant::now();
            let mut buf = Vec::new();
            let mut i = 0u64;
            while !s.load(Ordering::SeqCst) {
                // Paced to the wall clock: session i is due at i / rate seconds.
                let due = Duration::from_secs_f64(i as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait.min(Duration::from_millis(50)));
                    continue;
                }
                let key = sim.session(i, &mut buf);
                // A stopped broker makes sends fail (queue full); the producer keeps trying.
                let _ = sink.send(&key, &buf);
                if g.load(Ordering::SeqCst) && i.is_multiple_of(10) {
                    let _ = sink.send(&key, br#"{"session_id": "truncated"#);
                }
                i += 1;
                n.store(i, Ordering::SeqCst);
            }
            let _ = sink.flush();
        });
        Producer { stop, garbage, sent, handle: Some(handle) }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// `kafka.toml`'s settings for the test broker, windows and schedules divided by KAFKA_FACTOR
/// (1 h windows → 30 s, 5 min lateness → 2.5 s, 30 s idle timeout → 250 ms, the nightly schedule
/// → every 12 minutes).
fn kafka_config(dir: &Path, name: &str, brokers: &str, topic: &str, group: &str, store_prefix: Option<&str>) -> PathBuf {
    let mut text = format!(
        "batch_records = 500\n[source.kafka]\nbrokers = {brokers:?}\ngroup_id = {group:?}\ntopics = [{topic:?}]\n\
         [source.kafka.properties]\n\"fetch.wait.max.ms\" = \"100\"\n\"session.timeout.ms\" = \"20000\"\n\"heartbeat.interval.ms\" = \"1000\"\n\
         \"topic.metadata.refresh.interval.ms\" = \"1000\"\n\"reconnect.backoff.max.ms\" = \"1000\"\n\
         [window]\nsize = \"30s\"\nallowed_lateness = \"2500ms\"\nidle_partition_timeout = \"250ms\"\n\
         [state]\ncheckpoint_interval = \"1s\"\n\
         [train]\ntower = \"mlp\"\nschedule = \"0 */12 * * * *\"\n"
    );
    if let Some(prefix) = store_prefix {
        let endpoint = std::env::var("ULTR_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:9911".into());
        text.push_str(&format!(
            "[state.object_store]\nurl = \"s3://ultr-test/{prefix}\"\ncompact_interval = \"1s\"\nlease_ttl = \"4s\"\n\
             [state.object_store.options]\naws_endpoint = {endpoint:?}\naws_allow_http = \"true\"\naws_access_key_id = \"ultr\"\n\
             aws_secret_access_key = \"ultr\"\naws_region = \"us-east-1\"\n"
        ));
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Waits until Prometheus has scraped every target once and `check` holds on it.
fn wait_for(prom: &Prometheus, what: &str, limit: Duration, check: impl Fn(&Prometheus) -> bool) {
    let deadline = Instant::now() + limit;
    while !check(prom) {
        assert!(Instant::now() < deadline, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// (b) One instance on a real broker: silent when healthy; a burst of malformed records fires
/// IngestErrorsHigh; the broker stopped fires KafkaSourceDown and fails /healthz.
#[test]
fn single_instance_on_a_broker_is_silent_when_healthy_and_each_fault_fires_its_alert() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut broker = Some(tansu(dir.path(), "tansu", port, port, "memory://tansu/", false));
    let brokers = format!("127.0.0.1:{port}");
    let topic = unique("alerting-single");
    ensure_topic(&brokers, &topic, 3).unwrap();
    let producer = Producer::start(&brokers, &topic, 400);
    let config = kafka_config(dir.path(), "single", &brokers, &topic, &unique("g"), None);
    let addr = local_addr();
    let prom = Prometheus::start(&dir.path().join("prometheus"), KAFKA_FACTOR, std::slice::from_ref(&addr), "250ms");
    let ultr = Instance::start(&config, dir.path(), "single", &addr);
    let healthy = watch_fresh_start(&prom, KAFKA_FACTOR, "ultr_windows_closed_total");
    healthy.report("single healthy");
    assert!(healthy.firing().is_empty(), "a healthy instance fired {:?}\n{}", healthy.firing(), tail(&ultr.log));
    assert_eq!(prom.value("ultr_source_up"), Some(1.0));
    assert_eq!(ultr.healthz(), 200);
    let mut answered_here = answered(&prom);

    // A burst of malformed records: 1 in 11 records refused.
    producer.garbage.store(true, Ordering::SeqCst);
    let burst = watch_on(&prom, Duration::from_secs(60), Some("IngestErrorsHigh"), Duration::from_secs(5));
    producer.garbage.store(false, Ordering::SeqCst);
    burst.report("single malformed burst");
    assert!(burst.fired_after("IngestErrorsHigh").is_some(), "{burst:?}");
    answered_here.extend(answered(&prom));
    // Only IngestErrorsHigh, over the rules' quiet horizon from the burst's end: a rule whose `for:`
    // or range delays its reaction to the refused records would fire inside it.
    let horizon = Duration::from_secs_f64(quiet_horizon_s() / KAFKA_FACTOR);
    let after = watch(&prom, horizon, None);
    after.report("single after the burst");
    let mut fired = burst.firing();
    fired.extend(after.firing());
    fired.sort();
    fired.dedup();
    assert_eq!(fired, vec!["IngestErrorsHigh".to_string()], "only IngestErrorsHigh, over {horizon:?} after the burst");

    // The burst's last records are counted when the consumer reaches them: wait until it resolves.
    wait_for(&prom, "IngestErrorsHigh to resolve", Duration::from_secs(60), |p| p.alerts().is_empty());

    // The broker stopped.
    let sent_before = producer.sent.load(Ordering::SeqCst);
    drop(broker.take());
    let started = Instant::now();
    let outage = watch_on(&prom, Duration::from_secs(90), Some("KafkaSourceDown"), Duration::from_secs(15));
    outage.report("single broker stopped");
    assert!(outage.fired_after("KafkaSourceDown").is_some(), "{outage:?}\n{}", tail(&ultr.log));
    assert_eq!(prom.value("ultr_source_up"), Some(0.0));
    let (code, body) = http_get(&ultr.addr, "/healthz").unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("source unreachable"), "{body}");
    let others: Vec<String> = outage.firing().into_iter().filter(|a| a != "KafkaSourceDown").collect();
    assert!(others.is_empty(), "the outage also fired {others:?}");
    eprintln!("ALERTING single broker stopped: {:.1} s after the stop; producer had sent {sent_before}", started.elapsed().as_secs_f64());
    check_dashboard(&answered_here, &["ultr_kafka_consumer_lag_messages", "ultr_bad_records_total", "ultr_records_total"]);
    let served = served_names(&ultr.addr);
    let unserved: Vec<&str> = KAFKA_ONLY.into_iter().filter(|n| !served.contains(*n)).collect();
    assert!(unserved.is_empty(), "a Kafka instance after a malformed burst does not serve {unserved:?}");
    drop(producer);
}

/// From a fresh start: the alerts seen until every instance closed a window (`closed` ≥ 1) and the
/// rules' quiet horizon (longest `for:` + longest range, compressed) after that.
fn watch_fresh_start(prom: &Prometheus, factor: f64, closed: &str) -> Seen {
    let started = Instant::now();
    let mut seen = Seen::default();
    let mut merge = |more: Seen, offset: f64| {
        for (k, at) in more.0 {
            seen.0.entry(k).or_insert(at + offset);
        }
    };
    while prom.value(closed).unwrap_or(0.0) < 1.0 {
        assert!(started.elapsed() < Duration::from_secs(120), "no window closed in 120 s");
        merge(watch(prom, Duration::from_secs(1), None), started.elapsed().as_secs_f64());
    }
    let offset = started.elapsed().as_secs_f64();
    merge(watch(prom, Duration::from_secs_f64(quiet_horizon_s() / factor + 5.0), None), offset);
    eprintln!("ALERTING fresh start: first window after {offset:.0} s, watched {:.0} s", started.elapsed().as_secs_f64());
    seen
}

/// Each of `needles` is in some answered dashboard query.
fn check_dashboard(answered: &[String], needles: &[&str]) {
    for n in needles {
        assert!(answered.iter().any(|q| q.contains(n)), "the dashboard's {n} query returned nothing: answered {answered:?}");
    }
}

/// (c) Two instances in one group over the S3 server, with the compactor lease: silent when
/// healthy; one SIGKILLed: the other takes its partitions, no ultr alert (Prometheus's `up` says
/// it); the broker stopped: KafkaSourceDown from the survivor, /healthz 503.
#[test]
fn scaled_instances_are_silent_when_healthy_and_each_fault_fires_its_alert() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut broker = Some(tansu(dir.path(), "tansu", port, port, "memory://tansu/", false));
    let brokers = format!("127.0.0.1:{port}");
    let topic = unique("alerting-scaled");
    ensure_topic(&brokers, &topic, 4).unwrap();
    let producer = Producer::start(&brokers, &topic, 400);
    let (group, prefix) = (unique("g"), unique("alerting"));
    let config = kafka_config(dir.path(), "scaled", &brokers, &topic, &group, Some(&prefix));
    let (addr_a, addr_b) = (local_addr(), local_addr());
    let prom = Prometheus::start(&dir.path().join("prometheus"), KAFKA_FACTOR, &[addr_a.clone(), addr_b.clone()], "250ms");
    // B joins first and so leads the group: tansu keeps a member that missed its heartbeats as the
    // leader, and then nobody computes an assignment (docs/testing.md), so A, killed below, must
    // not lead. The first run of the takeover check below killed the first-started instance, and
    // the survivor kept its own two partitions for 130 s.
    let b = Instance::start(&config, dir.path(), "b", &addr_b);
    let lag_b = format!("ultr_kafka_consumer_lag_messages{{instance=\"{addr_b}\"}}");
    wait_for(&prom, "B to be assigned partitions", Duration::from_secs(90), |p| !p.query(&lag_b).is_empty());
    let a = Instance::start(&config, dir.path(), "a", &addr_a);
    let healthy = watch_fresh_start(&prom, KAFKA_FACTOR, "min(ultr_windows_closed_total)");
    healthy.report("scaled healthy");
    assert!(healthy.firing().is_empty(), "healthy instances fired {:?}\n{}\n{}", healthy.firing(), tail(&a.log), tail(&b.log));
    assert_eq!(prom.query("ultr_source_up == 1").len(), 2, "both instances report their source up");
    assert_eq!((a.healthz(), b.healthz()), (200, 200));

    // One instance SIGKILLed: the survivor takes over; ultr's rules stay silent.
    let mut a = a;
    a.guard.0.kill().unwrap();
    common::wait_within(&mut a.guard.0, Duration::from_secs(30)).expect("the instance exits within 30 s of SIGKILL");
    let killed = watch(&prom, Duration::from_secs(40), None);
    killed.report("scaled instance SIGKILLed");
    assert!(killed.firing().is_empty(), "the kill fired {:?}", killed.firing());
    assert_eq!(prom.value(&format!("up{{instance=\"{}\"}}", a.addr)), Some(0.0), "Prometheus sees the target down");
    // The survivor takes the killed instance's partitions: the consumer lag it exports moves on each
    // of the topic's four (a gauge of a partition it does not read keeps its last value: B held all
    // four before A joined), and it reads them to within 2.5 s of the producer (400 records a
    // second: a total lag under 1,000).
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
    loop {
        let lags = prom.query(&lag_b);
        for s in &lags {
            if let (Some(p), Some(v)) = (s["metric"]["partition"].as_str(), s["value"][1].as_str()) {
                seen.entry(p.to_string()).or_default().insert(v.to_string());
            }
        }
        let total: f64 = lags.iter().filter_map(|s| s["value"][1].as_str()?.parse::<f64>().ok()).sum();
        let moving = seen.values().filter(|values| values.len() >= 3).count();
        if moving == 4 && total < 1000.0 {
            eprintln!("ALERTING scaled: the survivor reads all 4 partitions, total lag {total}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the survivor did not take the killed instance's partitions: lag values seen per partition {seen:?}\n{}",
            tail(&b.log)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let closed_before = prom.value(&format!("ultr_windows_closed_total{{instance=\"{}\"}}", b.addr)).unwrap_or(0.0);

    // The broker stopped: the survivor pages.
    drop(broker.take());
    let outage = watch_on(&prom, Duration::from_secs(90), Some("KafkaSourceDown"), Duration::from_secs(15));
    outage.report("scaled broker stopped");
    assert!(outage.fired_after("KafkaSourceDown").is_some(), "{outage:?}\n{}", tail(&b.log));
    let (code, body) = http_get(&b.addr, "/healthz").unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("source unreachable"), "{body}");
    let others: Vec<String> = outage.firing().into_iter().filter(|a| a != "KafkaSourceDown").collect();
    assert!(others.is_empty(), "the outage also fired {others:?}");
    eprintln!("ALERTING scaled: the survivor had closed {closed_before} windows");
    drop(producer);
}

/// Faults on the demo shape (the simulator as the source), each in its own fresh deployment.
#[test]
fn demo_faults_fire_their_own_alerts() {
    let root = tempfile::tempdir().unwrap();
    struct Fault {
        name: &'static str,
        edit: fn(String) -> String,
        fires: &'static str,
        /// Alerts the fault may fire beside its own (what it also means).
        also: &'static [&'static str],
    }
    let faults = [
        Fault {
            name: "deterministic policy, embedding tower",
            edit: |t| t.replace("tau = 0.3", "tau = 0.0").replace("tower = \"mlp\"", "tower = \"embedding\""),
            fires: "IdentifiabilityLost",
            // π ≡ 1 also leaves misspecification untestable.
            also: &["MisspecificationUnassessable"],
        },
        Fault {
            name: "misspecified stream (MLP relevance, linear tower)",
            edit: |t| t.replace("relevance = \"linear\"", "relevance = \"mlp\"").replace("tower = \"mlp\"", "tower = \"linear\""),
            fires: "MisspecificationSuspected",
            also: &[],
        },
        Fault {
            name: "stale propensity logger",
            edit: |t| t.replace("interval_ms = 100", "interval_ms = 100\nlog_propensity = true\nlogged_tau = 0.8"),
            fires: "LoggedPropensityMismatch",
            also: &[],
        },
    ];
    let mut failures = Vec::new();
    for (i, fault) in faults.iter().enumerate() {
        let dir = root.path().join(format!("fault-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = demo_variant(&dir, "demo", fault.edit);
        let addr = local_addr();
        let prom = Prometheus::start(&dir.join("prometheus"), DEMO_FACTOR, std::slice::from_ref(&addr), "250ms");
        let ultr = Instance::start(&config, &dir, "demo", &addr);
        // Then the rules' quiet horizon longer: every other rule had its chance to fire.
        // The first model waits for `train.min_sessions` (50 s of the stream), then the fault shows.
        let seen = watch_on(&prom, Duration::from_secs(300), Some(fault.fires), Duration::from_secs_f64(quiet_horizon_s() / DEMO_FACTOR));
        seen.report(fault.name);
        if seen.fired_after(fault.fires).is_none() {
            failures.push(format!("{}: {} did not fire ({seen:?})\n{}", fault.name, fault.fires, tail(&ultr.log)));
        }
        let others: Vec<String> = seen.firing().into_iter().filter(|a| a != fault.fires && !fault.also.contains(&a.as_str())).collect();
        if !others.is_empty() {
            failures.push(format!("{}: also fired {others:?}", fault.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `[eval] qrels` on the demo, with the simulator's truth as the editors' labels, in two fresh
/// deployments. The shipped demo's production ranker is an MLP fitted on the true relevance (α = 1):
/// its logged order ranks above what a model learns back from clicks, and JudgedRankingBelowBaseline
/// fires, alone. A production ranker that is mostly fixed noise (α = 0.2) leaves the debiased model
/// ahead of both baselines: silent through the rules' quiet horizon after the first judged evaluation.
/// One stream per policy: what this asserts is the wiring (the service's judged figures reach the
/// rule, which fires alone); the statistical premise, the model below a strong logged order and
/// below neither baseline under a weak one, is asserted on three seeds by
/// `team_ranking::the_demo_model_ranks_below_a_strong_logged_order_and_not_below_a_weak_one`.
#[test]
fn a_model_ranking_below_the_logged_order_fires_judged_ranking_below_baseline() {
    const ALERT: &str = "JudgedRankingBelowBaseline";
    let root = tempfile::tempdir().unwrap();
    let with_labels = |t: String| t + "\n[eval]\nqrels = \"judged.qrels\"\n";
    let mut failures = Vec::new();
    for (name, alpha, fires) in [("strong production ranker", "1.0", true), ("weak production ranker", "0.2", false)] {
        let dir = root.path().join(name.replace(' ', "-"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = demo_variant(&dir, "demo", |t| with_labels(t.replace("tau = 0.3", &format!("tau = 0.3\nalpha = {alpha}"))));
        common::write_truth_qrels(&config, &dir.join("judged.qrels"));
        let addr = local_addr();
        let prom = Prometheus::start(&dir.join("prometheus"), DEMO_FACTOR, std::slice::from_ref(&addr), "250ms");
        let ultr = Instance::start(&config, &dir, "demo", &addr);
        wait_for(&prom, "a judged evaluation", Duration::from_secs(300), |p| p.value("ultr_judged_queries").is_some_and(|n| n > 0.0));
        let horizon = Duration::from_secs_f64(quiet_horizon_s() / DEMO_FACTOR);
        let seen = if fires { watch_on(&prom, Duration::from_secs(120), Some(ALERT), horizon) } else { watch(&prom, horizon + Duration::from_secs(5), None) };
        seen.report(&format!("judged, {name}"));
        let figure = |q: &str| prom.value(q).map_or("absent".to_string(), |v| format!("{v:.3}"));
        eprintln!(
            "ALERTING judged, {name}: nDCG@10 model {}, logged {}, naive {}; model − logged upper bound {}, model − naive upper bound {}",
            figure(r#"ultr_judged_ndcg{ranker="model",k="10"}"#),
            figure(r#"ultr_judged_ndcg{ranker="logged",k="10"}"#),
            figure(r#"ultr_judged_ndcg{ranker="naive_ctr",k="10"}"#),
            figure(r#"ultr_judged_ndcg_difference{baseline="logged",k="10",bound="upper"}"#),
            figure(r#"ultr_judged_ndcg_difference{baseline="naive_ctr",k="10",bound="upper"}"#),
        );
        match (fires, seen.fired_after(ALERT)) {
            (true, None) => failures.push(format!("{name}: {ALERT} did not fire ({seen:?})\n{}", tail(&ultr.log))),
            (false, Some(at)) => failures.push(format!("{name}: {ALERT} fired after {at:.1} s\n{}", tail(&ultr.log))),
            _ => {}
        }
        let others: Vec<String> = seen.firing().into_iter().filter(|a| a != ALERT).collect();
        if !others.is_empty() {
            failures.push(format!("{name}: also fired {others:?}"));
        }
        let served = served_names(&ultr.addr);
        if let Some(n) = JUDGED_ONLY.into_iter().find(|n| !served.contains(*n)) {
            failures.push(format!("{name}: an instance with qrels does not serve {n}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// No model ever trained is its own state (ModelMissing, not TrainingStale); a model then trained
/// silences it, and that model growing older than the limit fires TrainingStale. Rules time runs
/// 1,200× here (26 h → 78 s) and Prometheus evaluates the rules every 50 ms, so the rule's `for: 10m` lasts
/// 0.5 s, ten evaluations: TrainingStale must fire (its first firing sample, in Prometheus' clock)
/// no earlier than the model's age of 26 h + 10 min (78.5 s), which a rule with its `for:` dropped
/// (firing at 78.0 s) fails, and within 5 s of it. Only the model rules are exercised.
#[test]
fn no_model_is_model_missing_and_an_old_model_is_training_stale() {
    const FACTOR: f64 = 1200.0;
    let dir = tempfile::tempdir().unwrap();
    let config = demo_variant(dir.path(), "demo", |t| {
        t.replace("schedule = \"*/10 * * * * *\"\n", "").replace("sessions_per_second = 2000.0", "sessions_per_second = 500.0")
    });
    let addr = local_addr();
    let prom = Prometheus::start_evaluating(&dir.path().join("prometheus"), FACTOR, std::slice::from_ref(&addr), "250ms", "50ms");
    let _ultr = Instance::start(&config, dir.path(), "demo", &addr);
    // ModelMissing: the instance up for over 26 h (78 s here) with no model, for 10 min (0.5 s).
    let missing = watch(&prom, Duration::from_secs(150), Some("ModelMissing"));
    missing.report("no model ever trained");
    assert!(missing.fired_after("ModelMissing").is_some(), "{missing:?}");
    assert!(missing.fired_after("TrainingStale").is_none(), "no model is not a stale model");
    assert_eq!(prom.value("ultr_current_model_created_timestamp_seconds"), None, "no model: no creation time");
    // An external training promotes a first model.
    let out = Command::new(env!("CARGO_BIN_EXE_ultr"))
        .args(["train", "--config"])
        .arg(&config)
        .arg("--state")
        .arg(dir.path().join("demo-state"))
        .current_dir(dir.path())
        .output_within(crate::common::CHILD_DEADLINE)
        .unwrap();
    assert!(out.status.success(), "ultr train: {}", String::from_utf8_lossy(&out.stderr));
    wait_for(&prom, "the model's creation time", Duration::from_secs(60), |p| p.value("ultr_current_model_created_timestamp_seconds").is_some());
    let trained_at = Instant::now();
    wait_for(&prom, "ModelMissing to resolve", Duration::from_secs(30), |p| !p.alerts().iter().any(|(a, _)| a == "ModelMissing"));
    let created = prom.value("ultr_current_model_created_timestamp_seconds").unwrap();
    let stale = watch(&prom, Duration::from_secs(150), Some("TrainingStale"));
    stale.report("model older than the limit");
    assert!(stale.fired_after("TrainingStale").is_some(), "TrainingStale fires once the model is older than 26 h of rules time: {stale:?}");
    // The rule: older than 26 h (78 s here) for 10 min (0.5 s), against the same creation time the
    // rule reads. When it fired is read in Prometheus' own clock (the first sample of its ALERTS
    // series, written at the evaluation that fired it), not this process' clock: a wall-clock step
    // during the wait (what a CI run's 3 s early firing by this process' clock pointed to) moves both
    // the rule's `time()` and that sample, never their difference. It fires no earlier than 78.5 s,
    // and no later than that plus two evaluations (0.1 s) and a margin for Prometheus' scheduling
    // on a busy machine (to 5 s in all).
    let threshold = (26.0 * 3600.0 + 600.0) / FACTOR;
    let fired_at = prom.first_sample_at(r#"ALERTS{alertname="TrainingStale",alertstate="firing"}"#).expect("a firing alert has its ALERTS sample");
    let age = fired_at - created;
    eprintln!("ALERTING model older than the limit: TrainingStale firing at model age {age:.2} s in Prometheus' clock ({:.1} s after it saw the model by this process' clock; 26 h + 10 min of rules time = {threshold:.2} s)", trained_at.elapsed().as_secs_f64());
    assert!((threshold..=threshold + 5.0).contains(&age), "TrainingStale fired at model age {age:.2} s, expected {threshold:.2} s (+ up to 5 s)");
    assert!(stale.fired_after("ModelMissing").is_none());
}
