# A small static image: build with musl, ship on distroless (CA certificates, nonroot user).
FROM rust:1.89-alpine AS build
RUN apk add --no-cache musl-dev
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY benches benches
COPY crds crds
RUN cargo build --release --locked --bin crd-lifecycle \
    && strip target/release/crd-lifecycle

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/target/release/crd-lifecycle /usr/local/bin/crd-lifecycle
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/crd-lifecycle"]
CMD ["run"]
