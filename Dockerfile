# devshim: the device-plugin shim and its drivers (devshim_adapters), for the DaemonSet in deploy/.
#
# Debian's own slim base and Debian's Python, so the same image can be built without Docker from
# Debian's package mirror (scripts/build_image.py runs these instructions in a debootstrapped
# root; docs/operations.md). Packages are pinned here, in one place, and the builder reads them
# from this file. For reproducible builds also pin the base's digest (debian:bookworm-slim@sha256:
# ...); that cannot be looked up or checked offline, so it is left to whoever publishes the image.
FROM debian:bookworm-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3=3.11.2-1+b1 python3-venv=3.11.2-1+b1 \
    && rm -rf /var/lib/apt/lists/*

# Build stage: the project as a wheel, installed (not editable) with its dependencies into a
# venv at /opt/devshim, by the same script tests/deploy/test_dockerfile.py runs.
FROM base AS build
WORKDIR /src
COPY . .
RUN sh deploy/install.sh /opt/devshim /src

# Final stage: the venv alone; no sources, wheels or build caches.
FROM base
LABEL org.opencontainers.image.title="devshim" \
      org.opencontainers.image.description="A multi-version Kubernetes device-plugin shim: kubelet API versions in front, stable driver protocol behind." \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/devshim/devshim"
COPY --from=build /opt/devshim /opt/devshim
ENV PATH="/opt/devshim/bin:${PATH}"

# A device plugin cannot run as non-root: it creates its sockets in the kubelet's root-owned
# hostPath directories (/var/lib/kubelet/device-plugins, plugins_registry) and connects to the
# kubelet's root-owned sockets. The DaemonSet runs it as root but drops every capability
# (deploy/base/daemonset.yaml says why that suffices).
# hadolint ignore=DL3002
USER 0

# The ops HTTP server: /metrics, /healthz, /readyz.
EXPOSE 9477
ENTRYPOINT ["devshim"]
CMD ["run", "--config", "/etc/devshim/config.yaml"]
