# A small static image: build with musl, ship on distroless (CA certificates, nonroot user).
FROM rust:1.89-alpine AS build
RUN apk add --no-cache musl-dev \
    && cargo install --locked cargo-auditable@0.7.7
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY benches benches
COPY crds crds
# cargo auditable embeds the dependency list (crates and versions) in the binary's .dep-v0
# section, which `strip` keeps: scanners (cargo audit bin, Trivy, Grype) read it.
RUN cargo auditable build --release --locked --bin crd-lifecycle \
    && strip target/release/crd-lifecycle

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/target/release/crd-lifecycle /usr/local/bin/crd-lifecycle
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/crd-lifecycle"]
CMD ["run"]
