# Builds the `ultr` binary; used by docker-compose.yml.
FROM rust:1.95-bookworm AS build
WORKDIR /src
# cmake builds the bundled librdkafka; libssl-dev gives it TLS and SCRAM.
RUN apt-get update && apt-get install -y --no-install-recommends cmake libssl-dev && rm -rf /var/lib/apt/lists/*
COPY . .
# The image ships a stripped binary: the release profile keeps line tables for ultr's own code (for
# panics in tests), which a container does not need.
RUN cargo build --release --bin ultr && strip target/release/ultr

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/ultr /usr/local/bin/ultr
COPY pipelines /etc/ultr/pipelines
VOLUME /var/lib/ultr
ENTRYPOINT ["ultr"]
