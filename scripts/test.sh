#!/usr/bin/env bash
# The one test command (README): installs what the tests need on a fresh machine, starts a real
# Kafka-protocol broker (tansu 0.6.0) on 127.0.0.1:9092 when none is listening, and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

TANSU_VERSION=0.6.0
BROKER_HOST=127.0.0.1
BROKER_PORT=9092

log() { printf '==> %s\n' "$*"; }

# 1. System packages: a C toolchain for librdkafka (built from source by rdkafka-sys), zlib, and
#    Debian's prometheus package, which ships promtool for the alert-rule tests.
missing=()
for pkg in build-essential pkg-config zlib1g-dev cmake curl prometheus; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# 2. The broker: tansu from crates.io, with dynostore for memory:// storage.
if ! tansu --version 2>/dev/null | grep -q "tansu ${TANSU_VERSION}"; then
  log "installing tansu ${TANSU_VERSION} (about 8 minutes on 2 cores)"
  cargo install tansu --version "${TANSU_VERSION}" --features dynostore --locked
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
