# The "training job" image: the CUDA-named test library (libcudart.so.12 and
# libnccl.so.2 with the real symbol names) and the workload program that calls
# it, from node/tests/native. Build from the repository root.
FROM debian:bookworm-slim AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY node/tests/native /src
RUN mkdir -p /out/lib \
 && gcc -shared -fPIC -O1 -fno-omit-frame-pointer -fcf-protection=none -o /out/lib/libcudart.so.12 /src/fakecuda.c \
 && cp /out/lib/libcudart.so.12 /out/lib/libnccl.so.2 \
 && gcc -O2 -o /out/workload /src/workload.c -ldl

FROM debian:bookworm-slim
COPY --from=build /out/lib /opt/fakecuda/lib
COPY --from=build /out/workload /usr/local/bin/workload
ENTRYPOINT ["/usr/local/bin/workload"]
