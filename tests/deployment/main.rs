//! Integration tests of ultr's deployments: real `ultr` processes against a real Kafka-protocol
//! broker (tansu), a real S3 server (moto), a real Prometheus server and a real ONNX runtime.
//! Their assertions wait on wall-clock time, so they live in a binary of their own, apart from the
//! CPU-bound training tests of `tests/laboratory/`. One binary links burn, datafusion and rdkafka once.

// The references are tuples of the columns they compare, and a simulated stream takes each knob a
// test varies by name.
#![allow(clippy::type_complexity, clippy::too_many_arguments)]

#[path = "../common/mod.rs"]
mod common;

mod alerting;
mod confluent_producers;
mod deploy;
mod http_endpoint;
mod kafka_resume;
mod kafka_roundtrip;
mod kafka_security;
mod kill_restart;
mod onnx;
mod outage;
mod scale_out;
mod service;
