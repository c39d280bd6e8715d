# syntax=docker/dockerfile:1
# One image with both binaries of vcluster-plugin-operator:
#   /usr/local/bin/vcluster-plugin-operator  the operator (the entrypoint; config/manager)
#   /usr/local/bin/vcluster-plugin-syncer    the embedded runtime, which the operator runs as
#                                            the plugin sidecar from this same image and version
#
#   docker build -t ghcr.io/vcp-dev/vcluster-plugin-operator:0.1.0 .
#
# Reproducible: base images pinned by tag, dependencies exactly as in Cargo.lock (--locked).
# The runtime image is distroless (glibc, CA certificates, no shell) and runs as non-root; both
# binaries are static, so they need nothing from it.
#
# No container engine runs where the tests run: tests/tests/packaging_dockerfile.rs replays the build
# stage (the context as .dockerignore leaves it, each COPY, the RUN with the ENV, in a chroot)
# and checks the final stage against what it produced.

# Debian 12 (bookworm) in both stages: the glibc linked into the binaries (2.36) is the one
# the runtime base carries too.
FROM docker.io/library/rust:1.95.0-slim-bookworm AS builder
WORKDIR /src
ENV CARGO_INCREMENTAL=0 \
    CARGO_NET_RETRY=10 \
    CARGO_PROFILE_RELEASE_STRIP=symbols
# Every workspace member's manifest must be present, even the ones not built here (the test
# suite's benches and examples are not: tests/Cargo.toml names their files, so cargo does not
# look for them unless they are built).
COPY Cargo.toml Cargo.lock ./
COPY crds crds
COPY operator operator
COPY syncer-runtime syncer-runtime
COPY tests/Cargo.toml tests/Cargo.toml
COPY tests/src tests/src
# Both binaries are linked statically against glibc (crt-static): the runtime is also copied
# into vCluster's own container as a v2 plugin, where no glibc of ours can be assumed. One
# RUSTFLAGS for both keeps it one compilation of the dependencies; `--target` (the build
# machine's own triple, so also under buildx for arm64) keeps the flag off build scripts and
# proc macros, which must stay dynamic. It names no package: the root's default members, the
# build from source of the README, so the test crate's features stay out (its packaging test).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    triple="$(rustc -vV | sed -n 's/^host: //p')" \
    && RUSTFLAGS="-C target-feature=+crt-static" \
       cargo build --release --locked --target "$triple" \
    && mkdir -p /out \
    && cp "target/$triple/release/vcluster-plugin-operator" \
          "target/$triple/release/vcluster-plugin-syncer" /out/

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
