# Build: the release binary, with sqlx's migrations embedded at compile time.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# The dependencies first, in a layer of their own: a change to the sources
# rebuilds the scheduler only. The bench and binary names of Cargo.toml need
# files to exist; empty ones do.
RUN mkdir -p src/bin benches \
 && echo 'fn main() {}' > src/main.rs \
 && echo 'fn main() {}' > src/bin/scheduler-supervise.rs \
 && touch src/lib.rs \
 && for b in core claims serve spawn burst api embed notify after console output shards history; do echo 'fn main() {}' > "benches/$b.rs"; done \
 && cargo build --release --locked --bin scheduler --bin scheduler-supervise \
 && rm -rf src benches
COPY build.rs ./
COPY src ./src
COPY migrations ./migrations
COPY schema ./schema
COPY benches ./benches
# Newer than the placeholders, so cargo rebuilds the crate itself.
RUN touch src/main.rs src/lib.rs src/bin/scheduler-supervise.rs \
 && cargo build --release --locked --bin scheduler --bin scheduler-supervise

# Run: a slim image with /bin/sh for `shell` jobs, tzdata and CA certificates
# for the tools those jobs call (the scheduler's own TLS — PostgreSQL and
# `http` jobs — uses rustls with the Mozilla roots compiled in, so it works
# the same in any image; its zones come from chrono-tz, compiled in too).
FROM debian:bookworm-slim
LABEL org.opencontainers.image.title="scheduler" \
      org.opencontainers.image.description="A period-keyed cron scheduler: every period runs once, never twice, never zero times." \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.source="https://example.invalid/scheduler"
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates tzdata \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 scheduler \
 && useradd --system --uid 10001 --gid 10001 --home /app --create-home scheduler \
 && mkdir -p /var/lib/scheduler \
 && chown 10001:10001 /var/lib/scheduler
COPY --from=build /src/target/release/scheduler /src/target/release/scheduler-supervise /usr/local/bin/
WORKDIR /app
# No jobs.toml in the image: mount yours at /app/jobs.toml (or point
# SCHEDULER_CONFIG elsewhere). Without one the scheduler says it cannot read
# /app/jobs.toml and exits 2, rather than running a demo file's jobs.
# Numeric, so Kubernetes' runAsNonRoot can check it.
USER 10001:10001
ENV SCHEDULER_CONFIG=/app/jobs.toml
# The SQLite default lives on the volume; DATABASE_URL=postgres://… for
# several replicas (it wins over [scheduler].database_url in jobs.toml).
ENV DATABASE_URL=sqlite:///var/lib/scheduler/scheduler.db
VOLUME ["/var/lib/scheduler"]
EXPOSE 9090
# Through the binary itself: the image has no curl.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/usr/local/bin/scheduler", "health", "--url", "http://127.0.0.1:9090/healthz"]
# As PID 1 the scheduler reaps orphans and handles SIGTERM itself.
ENTRYPOINT ["/usr/local/bin/scheduler"]
CMD ["serve", "--listen", "0.0.0.0:9090"]
