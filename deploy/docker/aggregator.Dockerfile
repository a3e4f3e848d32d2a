# ingero (aggregator + CLI) image. Build from the repository root:
#   docker build -f deploy/docker/aggregator.Dockerfile -t ghcr.io/ingero-io/ingero:0.1.0 .
# Stage 1 builds `ingero` (serve, stragglers, report, sql, …); stage 2 is
# distroless, non-root (uid 65532), read-only-root friendly.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The workspace build needs the agent's eBPF toolchain only when building the
# agent; `-p ingero` does not compile it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p ingero --bin ingero --features mcp \
 && install -D -m 0755 target/release/ingero /out/ingero \
 && strip /out/ingero

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ingero /usr/local/bin/ingero
USER 65532:65532
EXPOSE 7070 7071
ENTRYPOINT ["/usr/local/bin/ingero"]
CMD ["serve"]
