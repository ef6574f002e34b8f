# syntax=docker/dockerfile:1
# skewd image: one image for the node agent (DaemonSet) and the controller (Deployment); the
# command picks the role (`skewd agent ...` / `skewd controller ...`).
#
# Stage 1 builds the wheel exactly as `python -m build` does for PyPI (so the image carries what a
# pip user gets: rule packs, fault-lab scenarios, exporter mappings) and installs it into a venv.
# Stage 2 copies only that venv onto the same slim base: no compiler, no build tools, no sources.
#
# Privileges (deploy/kubernetes/agent-daemonset.yaml, docs/security.md):
# - The image runs as the unprivileged user 10001 by default; the controller needs nothing more.
# - The agent reads the host's /sys and /proc (mounted read-only at /host/sys, /host/proc; the
#   config's sys_root / proc_root point there), the host's interfaces over netlink (hostNetwork;
#   link and qdisc dumps need no capability) and NVML through the NVIDIA container runtime.
# - Live packet timing (the pkt collector) opens AF_PACKET sockets: CAP_NET_RAW. Kubernetes adds a
#   capability to root's sets only (no ambient capabilities for other users), so the agent
#   container runs as uid 0 with every capability dropped but NET_RAW, a read-only root file
#   system and no privilege escalation. Without the pkt collector it runs as 10001 like the
#   controller. Reading another network namespace (collectors.netdev.netns) would need
#   CAP_SYS_ADMIN (setns); the shipped manifests do not grant it.
#
# Build: docker build -t ghcr.io/skewd/skewd:0.1.0 .

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY skewd/ skewd/
COPY agent/ agent/
COPY collectors/ collectors/
COPY rules/ rules/
COPY controller/ controller/
COPY lab/ lab/
RUN python -m pip install "build>=1.0" \
    && python -m build --outdir /dist . \
    && python -m venv /opt/skewd \
    && /opt/skewd/bin/pip install /dist/skewd-*.whl \
    && ln -s "$(/opt/skewd/bin/python -c 'from skewd.rules.cli import PACKS; print(PACKS)')" /opt/skewd/packs \
    && /opt/skewd/bin/skewd rules lint /opt/skewd/packs

FROM python:${PYTHON_VERSION}-slim-bookworm
LABEL org.opencontainers.image.title="skewd" \
      org.opencontainers.image.description="Skew detection for GPU inference clusters: node agent and controller" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/skewd/skewd"
COPY --from=build /opt/skewd /opt/skewd
RUN useradd --system --uid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin skewd \
    && mkdir -p /var/lib/skewd /etc/skewd \
    && chown 10001:10001 /var/lib/skewd
ENV PATH=/opt/skewd/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# /opt/skewd/packs: the shipped rule packs at a path that does not depend on the Python version
# (the manifests list it before the site's own rule files)
USER 10001
WORKDIR /var/lib/skewd
ENTRYPOINT ["skewd"]
CMD ["--help"]
