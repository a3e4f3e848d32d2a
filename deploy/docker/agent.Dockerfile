# ingero-agent image. Build from the repository root:
#   docker build -f deploy/docker/agent.Dockerfile -t ghcr.io/ingero-io/ingero-agent:0.1.0 .
# Stage 1 compiles the eBPF programs (clang + libbpf headers, CO-RE) and the
# agent without the `store` feature (no embedded aggregator: the DaemonSet
# ships to `ingero serve`); stage 2 is distroless (glibc + libgcc only, ~25 MB) with the binary.
FROM rust:1.95-bookworm AS build
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends clang libbpf-dev linux-libc-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p ingero-node --bin ingero-agent --no-default-features \
 && install -D -m 0755 target/release/ingero-agent /out/ingero-agent \
 && strip /out/ingero-agent

# The agent runs as root with the capabilities the chart grants (no shell,
# no package manager in the image).
FROM gcr.io/distroless/cc-debian12
COPY --from=build /out/ingero-agent /usr/local/bin/ingero-agent
ENTRYPOINT ["/usr/local/bin/ingero-agent"]
CMD ["run"]
