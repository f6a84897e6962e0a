#!/usr/bin/env bash
# The one test command (README): installs what the tests need on a fresh machine, starts a real
# Kafka-protocol broker (tansu 0.6.0) on 127.0.0.1:9092 when none is listening, and runs every test.
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
#    stunnel (a real TLS listener in front of a broker) and the openssl CLI (test certificates).
missing=()
for pkg in build-essential pkg-config zlib1g-dev libssl-dev cmake curl prometheus stunnel4 openssl; do
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

port_open() { (exec 3<>"/dev/tcp/${BROKER_HOST}/${BROKER_PORT}") 2>/dev/null; }
broker_pid=""
cleanup() { [ -n "$broker_pid" ] && kill "$broker_pid" 2>/dev/null || true; }
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

# 3. Every test, in the release profile (one build serves tests, benches and the binary).
log "cargo test --release"
cargo test --release "$@"
