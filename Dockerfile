# syntax=docker/dockerfile:1
# One image with both binaries of vcluster-plugin-operator:
#   /usr/local/bin/vcluster-plugin-operator  the operator (the entrypoint; config/manager)
#   /usr/local/bin/vcluster-plugin-syncer    the embedded runtime, which the operator runs as
#                                            the plugin sidecar from this same image and version
#
#   docker build -t ghcr.io/vcp-dev/vcluster-plugin-operator:0.1.0 .
#
# Reproducible: base images pinned by tag, dependencies exactly as in Cargo.lock (--locked).
# The runtime image is distroless (glibc, CA certificates, no shell) and runs as non-root.

# Debian 12 (bookworm) in both stages: the binaries link against the glibc they run with.
FROM docker.io/library/rust:1.95.0-slim-bookworm AS builder
WORKDIR /src
ENV CARGO_INCREMENTAL=0 \
    CARGO_NET_RETRY=10 \
    CARGO_PROFILE_RELEASE_STRIP=symbols
# Every workspace member's manifest must be present, even the ones not built here.
COPY Cargo.toml Cargo.lock ./
COPY crds crds
COPY operator operator
COPY syncer-runtime syncer-runtime
COPY tests/Cargo.toml tests/Cargo.toml
COPY tests/src tests/src
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p vcluster-plugin-operator -p vcp-syncer-runtime \
    && mkdir -p /out \
    && cp target/release/vcluster-plugin-operator target/release/vcluster-plugin-syncer /out/

FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="vcluster-plugin-operator" \
      org.opencontainers.image.description="Installs VClusterPlugin objects into their vCluster; embedded plugin runtime" \
      org.opencontainers.image.source="https://github.com/vcp-dev/vcluster-plugin-operator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=builder /out/vcluster-plugin-operator /usr/local/bin/vcluster-plugin-operator
COPY --from=builder /out/vcluster-plugin-syncer /usr/local/bin/vcluster-plugin-syncer
# distroless's `nonroot` user, by number so that runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/vcluster-plugin-operator"]
