#!/usr/bin/env bash
# The one test command (README): installs what the tests need on a fresh machine, builds ultr with
# its tests and a real Kafka-protocol broker (tansu 0.6), starts the broker on 127.0.0.1:9092 when
# none is listening and moto's S3 server, and runs every test. Tests that need a broker of their own
# (outage with sqlite storage, SASL behind a TLS listener) start it and `stunnel` themselves.
# Arguments go to `cargo nextest run` (e.g. `scripts/test.sh -E 'test(/^windows::/)'`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

BROKER_HOST=127.0.0.1
BROKER_PORT=9092

log() { printf '==> %s\n' "$*"; }

# 1. System packages: a C toolchain for librdkafka (built from source by rdkafka-sys), zlib, OpenSSL
#    (librdkafka's TLS and SCRAM), Debian's prometheus package (promtool for the alert-rule tests),
#    stunnel (a real TLS listener in front of a broker), the openssl CLI (test certificates),
#    python3 with venv (the ONNX runtime below), and Chromium with its WebDriver (the status page's
#    browser test).
missing=()
for pkg in build-essential pkg-config zlib1g-dev libssl-dev cmake curl prometheus stunnel4 openssl python3 python3-venv chromium chromium-driver; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# 2. A real ONNX runtime for tests/deployment/onnx.rs (onnxruntime, numpy), a real S3-compatible server for
#    tests/deployment/scale_out.rs (moto's server mode: S3 over HTTP with conditional writes, installed from
#    PyPI in seconds), selenium (WebDriver client for the status page's browser test) and
#    pytrec_eval (trec_eval's measures, against which `ultr eval --qrels` is checked), in a venv of
#    their own. Installed in the background: it waits on the network while the build below keeps
#    both cores busy.
ULTR_VENV="${ULTR_VENV:-$HOME/.cache/ultr/venv}"
VENV_LOG="${TMPDIR:-/tmp}/ultr-venv.log"
venv_pid=""
if ! "$ULTR_VENV/bin/python" -c "import onnxruntime, numpy, moto.server, selenium, pytrec_eval" 2>/dev/null; then
  log "installing onnxruntime, numpy, moto[server], selenium and pytrec_eval into $ULTR_VENV (in the background)"
  (
    python3 -m venv "$ULTR_VENV" &&
      "$ULTR_VENV/bin/pip" install -q --disable-pip-version-check "onnxruntime>=1.16,<2" "numpy>=1.24" "moto[s3,server]>=5.1,<6" "selenium>=4.20,<5" "pytrec-eval-terrier>=0.5.6,<0.6"
  ) >"$VENV_LOG" 2>&1 &
  venv_pid=$!
fi

# 3. Build everything the tests run, in one cargo build: ultr, its tests, and the tests' broker
#    (`ultr-test-broker`, tansu 0.6's command line; the workspace member tools/test-broker), so that
#    the crates tansu and ultr share compile once. The tests find the broker beside their own binary.
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
NEXTEST=(cargo nextest run --workspace --release)
if ! cargo nextest --version >/dev/null 2>&1; then
  # The dev profile: a test runner only spawns processes, and it builds in half the release time.
  log "installing cargo-nextest"
  cargo install cargo-nextest --locked --debug
fi
log "building ultr, its tests and the test broker (release)"
"${NEXTEST[@]}" --no-run
BROKER_BIN="$TARGET_DIR/release/ultr-test-broker"

if [ -n "$venv_pid" ] && ! wait "$venv_pid"; then
  echo "installing the Python packages failed:"; cat "$VENV_LOG"; exit 1
fi
export ULTR_PYTHON="$ULTR_VENV/bin/python"

port_open() { (exec 3<>"/dev/tcp/${BROKER_HOST}/${BROKER_PORT}") 2>/dev/null; }
broker_pid=""
s3_pid=""
cleanup() {
  [ -n "$broker_pid" ] && kill "$broker_pid" 2>/dev/null || true
  [ -n "$s3_pid" ] && kill "$s3_pid" 2>/dev/null || true
}
trap cleanup EXIT
if port_open; then
  log "a broker is already listening on ${BROKER_HOST}:${BROKER_PORT}; using it"
else
  log "starting the test broker (tansu) on ${BROKER_HOST}:${BROKER_PORT} (memory storage)"
  "$BROKER_BIN" broker \
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
if [ $# -gt 0 ]; then
  log "cargo nextest run --release $*"
  "${NEXTEST[@]}" "$@"
else
  # The deployment tests' waits are wall-clock: they run as their own phase, apart from the
  # CPU-bound training tests of the laboratory. Mostly waiting (about one core busy at three
  # threads), they run four at a time on two cores (docs/testing.md).
  log "cargo nextest run --release: tests/deployment (the benches build beside them)"
  # The benches (`benches/`) build while the deployment tests wait on their services: in the release
  # profile, so they link the library built above, at the lowest CPU priority, and after nextest's
  # own (no-op) build has let go of cargo's lock. A bench that stops compiling fails the run
  # without adding its build to the run's time (docs/testing.md).
  BENCH_LOG="${TMPDIR:-/tmp}/ultr-benches-build.log"
  ( sleep 20 && nice -n 19 cargo build --workspace --release --bench '*' >"$BENCH_LOG" 2>&1 ) &
  bench_pid=$!
  "${NEXTEST[@]}" -E 'binary(deployment)' --test-threads 4
  if ! wait "$bench_pid"; then
    echo "the benches do not build (cargo build --release --bench '*'):"; tail -50 "$BENCH_LOG"; exit 1
  fi
  log "cargo nextest run --release: tests/laboratory and the unit tests"
  "${NEXTEST[@]}" -E 'not binary(deployment)'
fi
