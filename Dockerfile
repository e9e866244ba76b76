# syntax=docker/dockerfile:1
# Small static images of the four components and of kubectl-vc (the chart's snapshot scheduler runs
# `kubectl-vc snapshot schedule`, its uninstall hooks `kubectl-vc uninstall`), five targets, one each:
#
#   docker build --target vc-manager -t <registry>/vc-manager:0.1.0 .
#   docker build --target syncer     -t <registry>/syncer:0.1.0 .
#   docker build --target vn-agent   -t <registry>/vn-agent:0.1.0 .
#   docker build --target vc-dns     -t <registry>/vc-dns:0.1.0 .
#   docker build --target kubectl-vc -t <registry>/kubectl-vc:0.1.0 .
#
# Push all five: the Helm chart (charts/virtualcluster) requires image.registry and expects exactly these
# repository names under it, tagged with the chart's appVersion (the workspace version) unless image.tag says
# otherwise (a component's image.digest pins it).
#
# The binaries are linked statically against musl (TLS is rustls on ring; no OpenSSL), so the final images
# hold one file each on top of distroless/static: CA certificates, /etc/passwd with the non-root user 65532,
# no shell.

ARG RUST_VERSION=1.89

FROM rust:${RUST_VERSION}-bookworm AS builder
# musl-gcc compiles ring's C and assembly for the musl target.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
ENV CC_x86_64_unknown_linux_musl=musl-gcc \
    CARGO_PROFILE_RELEASE_STRIP=symbols
WORKDIR /src
COPY . .
# Cache mounts keep the registry and the build folder between builds; the binaries are copied out of the
# cached folder because cache mounts are not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --target x86_64-unknown-linux-musl \
      -p vc-manager -p syncer -p vn-agent -p vc-dns -p kubectl-vc \
      --bin vc-manager --bin syncer --bin vn-agent --bin vc-dns --bin kubectl-vc \
 && mkdir -p /out \
 && cp target/x86_64-unknown-linux-musl/release/vc-manager \
       target/x86_64-unknown-linux-musl/release/syncer \
       target/x86_64-unknown-linux-musl/release/vn-agent \
       target/x86_64-unknown-linux-musl/release/vc-dns \
       target/x86_64-unknown-linux-musl/release/kubectl-vc /out/

FROM gcr.io/distroless/static-debian12:nonroot AS vc-manager
COPY --from=builder /out/vc-manager /usr/local/bin/vc-manager
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/vc-manager"]

FROM gcr.io/distroless/static-debian12:nonroot AS syncer
COPY --from=builder /out/syncer /usr/local/bin/syncer
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/syncer"]

FROM gcr.io/distroless/static-debian12:nonroot AS vn-agent
COPY --from=builder /out/vn-agent /usr/local/bin/vn-agent
USER 65532:65532
EXPOSE 10550 10551
ENTRYPOINT ["/usr/local/bin/vn-agent"]

FROM gcr.io/distroless/static-debian12:nonroot AS vc-dns
COPY --from=builder /out/vc-dns /usr/local/bin/vc-dns
USER 65532:65532
# DNS on an unprivileged port (the chart's Service serves 53), admin endpoint.
EXPOSE 5353/udp 5353/tcp 8080
ENTRYPOINT ["/usr/local/bin/vc-dns"]

FROM gcr.io/distroless/static-debian12:nonroot AS kubectl-vc
COPY --from=builder /out/kubectl-vc /usr/local/bin/kubectl-vc
USER 65532:65532
# In the chart: `kubectl-vc snapshot schedule --admin-address 0.0.0.0:8080` (/metrics, /healthz, /readyz) and
# the `kubectl-vc uninstall` hooks, with the in-cluster ServiceAccount.
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kubectl-vc"]
