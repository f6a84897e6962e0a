#!/usr/bin/env bash
# The one test command (README): installs what the tests need on a fresh machine, starts a real
# Kafka-protocol broker (tansu 0.6.0) on 127.0.0.1:9092 when none is listening, installs onnxruntime
# (PyPI, in a venv) for the ONNX export test, and runs every test.
# Tests that need their own broker (outage with sqlite storage, SASL behind a TLS listener) start
# `tansu` and `stunnel` themselves; both are installed here.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

TANSU_VERSION=0.6.0
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

# 2. The broker: tansu from crates.io, with dynostore for memory:// storage and libsql for
#    sqlite:// storage (topics that survive a broker restart, for the outage test).
TANSU_STAMP="$HOME/.cargo/ultr-tansu-features"
TANSU_FEATURES="dynostore,libsql"
if ! tansu --version 2>/dev/null | grep -q "tansu ${TANSU_VERSION}" || [ "$(cat "$TANSU_STAMP" 2>/dev/null)" != "$TANSU_FEATURES" ]; then
  log "installing tansu ${TANSU_VERSION} with ${TANSU_FEATURES} (about 15 minutes on 2 cores)"
  cargo install tansu --version "${TANSU_VERSION}" --features "${TANSU_FEATURES}" --locked --force
  echo "$TANSU_FEATURES" > "$TANSU_STAMP"
fi

# 3. A real ONNX runtime for tests/deployment/onnx.rs (onnxruntime, numpy), a real S3-compatible server for
#    tests/deployment/scale_out.rs (moto's server mode: S3 over HTTP with conditional writes, installed from
#    PyPI in seconds), selenium (WebDriver client for the status page's browser test) and
#    pytrec_eval (trec_eval's measures, against which `ultr eval --qrels` is checked), in a venv of
#    their own.
ULTR_VENV="${ULTR_VENV:-$HOME/.cache/ultr/venv}"
if ! "$ULTR_VENV/bin/python" -c "import onnxruntime, numpy, moto.server, selenium, pytrec_eval" 2>/dev/null; then
  log "installing onnxruntime, numpy, moto[server], selenium and pytrec_eval into $ULTR_VENV"
  python3 -m venv "$ULTR_VENV"
  "$ULTR_VENV/bin/pip" install -q --disable-pip-version-check "onnxruntime>=1.16,<2" "numpy>=1.24" "moto[s3,server]>=5.1,<6" "selenium>=4.20,<5" "pytrec-eval-terrier>=0.5.6,<0.6"
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
  log "starting tansu on ${BROKER_HOST}:${BROKER_PORT} (memory storage)"
  tansu broker \
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

# 4. Every test, in the release profile (one build serves tests, benches and the binary).
log "cargo test --release"
cargo test --release "$@"
