# Build: the release binary, with sqlx's migrations embedded at compile time.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
COPY benches ./benches
COPY tests ./tests
# scheduler-supervise is the small per-job supervisor the scheduler starts
# from beside itself.
RUN cargo build --release --locked --bin scheduler --bin scheduler-supervise

# Run: a slim image with /bin/sh for `shell` jobs, CA certificates for
# `http` jobs over TLS, and tzdata-free zones (chrono-tz compiles them in).
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home /app --create-home scheduler
COPY --from=build /src/target/release/scheduler /src/target/release/scheduler-supervise /usr/local/bin/
WORKDIR /app
COPY jobs.toml /app/jobs.toml
USER scheduler
# The SQLite default lives in /app; use DATABASE_URL=postgres://… for replicas.
ENV SCHEDULER_CONFIG=/app/jobs.toml
# As PID 1 the scheduler reaps orphans and handles SIGTERM itself.
ENTRYPOINT ["/usr/local/bin/scheduler"]
CMD ["serve", "--listen", "0.0.0.0:9090"]
EXPOSE 9090
