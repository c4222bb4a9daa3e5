# kforge server image (docs/CONTAINER.md).
#
# Production (NVIDIA's CUDA images; the CUDA major of both must match, since
# kforge links libnvrtc.so.<major>):
#   docker build -t kforge \
#     --build-arg BUILD_BASE=nvidia/cuda:13.0.0-devel-ubuntu24.04 \
#     --build-arg RUNTIME_BASE=nvidia/cuda:13.0.0-runtime-ubuntu24.04 .
# Here (no registry): scripts/test_image.sh makes local bases from Debian
# bookworm plus this machine's /usr/local/cuda and builds with them.
ARG BUILD_BASE=nvidia/cuda:13.0.0-devel-ubuntu24.04
ARG RUNTIME_BASE=nvidia/cuda:13.0.0-runtime-ubuntu24.04

# --- deps: the packages CI installs (scripts/install_deps.sh), a layer of
# its own so that a source change does not reinstall them.
FROM ${BUILD_BASE} AS deps
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY scripts/install_deps.sh scripts/
RUN scripts/install_deps.sh && rm -rf /var/lib/apt/lists/*

# --- build: CI's build script, restricted to the server binary; then the
# binary (debug info stripped) and the shared libraries it loads, except
# glibc's (the runtime base has its own) and NVRTC (the runtime base's CUDA
# libraries), into /out.
FROM deps AS build
ARG KFORGE_BUILD_TARGETS=kforge
COPY . .
RUN KFORGE_BUILD_DIR=/build KFORGE_BUILD_TARGETS="${KFORGE_BUILD_TARGETS}" scripts/build.sh
RUN set -eu; \
    mkdir -p /out/bin /out/lib; \
    objcopy --strip-debug /build/cli/kforge /out/bin/kforge; \
    if ldd /out/bin/kforge | grep 'not found'; then exit 1; fi; \
    ldd /out/bin/kforge | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | \
    while read -r name path; do \
      case "$name" in \
        libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libnvrtc*|libcuda.so*) ;; \
        *) cp -L "$path" "/out/lib/$name" ;; \
      esac; \
    done; \
    ls /out/lib

# --- runtime: the binary, its libraries, a non-root user and a cache
# volume. NVRTC (libnvrtc, libnvrtc-builtins) comes from the base; the GPU
# driver (libcuda) from the host, through the NVIDIA container runtime, and
# only for kforge's GPU commands: serving and compiling need none.
FROM ${RUNTIME_BASE} AS runtime
COPY --from=build /out/lib/ /opt/kforge/lib/
COPY --from=build /out/bin/kforge /opt/kforge/bin/kforge
RUN set -eu; \
    echo /opt/kforge/lib > /etc/ld.so.conf.d/zz-kforge.conf; \
    ldconfig; \
    ln -s /opt/kforge/bin/kforge /usr/local/bin/kforge; \
    groupadd --system --gid 10001 kforge; \
    useradd --system --uid 10001 --gid kforge --home-dir /var/cache/kforge \
      --no-create-home --shell /usr/sbin/nologin kforge; \
    mkdir -p /var/cache/kforge; \
    chown kforge:kforge /var/cache/kforge; \
    kforge --version
# Every `serve` flag also reads KFORGE_<FLAG>; `docker run -e` overrides
# these. KFORGE_SERVER is where the client commands, and so the
# HEALTHCHECK's `kforge health`, connect: keep its port equal to
# KFORGE_LISTEN's.
ENV KFORGE_LISTEN=0.0.0.0:50051 \
    KFORGE_METRICS_LISTEN=0.0.0.0:9464 \
    KFORGE_CACHE_DIR=/var/cache/kforge \
    KFORGE_SERVER=127.0.0.1:50051 \
    HOME=/var/cache/kforge
USER kforge:kforge
WORKDIR /var/cache/kforge
VOLUME ["/var/cache/kforge"]
# 50051: gRPC (kforge.v1.KernelService, grpc.health.v1, reflection);
# 9464: Prometheus metrics (GET /metrics).
EXPOSE 50051 9464
# grpc.health.v1.Health/Check: SERVING (exit 0) once listening and, with
# --warm-from, once the bundle is loaded; NOT_SERVING while draining.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["kforge", "health", "--timeout", "4s"]
# SIGTERM drains (in-flight calls finish; exit 0). kforge gives running
# compiles --shutdown-grace (30 s) before killing them, so stop with a
# longer timeout than docker's 10 s: docker run --stop-timeout 40, or
# Kubernetes' terminationGracePeriodSeconds: 40.
STOPSIGNAL SIGTERM
ENTRYPOINT ["kforge"]
CMD ["serve"]
