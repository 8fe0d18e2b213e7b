# One image for every awooop service: `awooop serve ingest|scheduler|saga|gateway`,
# `awooop migrate`, `awooop admin ...` and `awooop health` (the healthcheck).
# docker-compose.yml runs it; ports and variables are in docs/configuration.md.
#
# Behind a registry mirror and a private package index (docs/operations.md, Containers):
#   docker build --build-arg BASE_IMAGE=mirror.example/library/python:3.11-slim \
#     --build-arg PIP_INDEX_URL=https://pypi.example/simple --secret id=ca,src=corp-ca.pem .
# Podman keeps the HEALTHCHECK only in Docker format: podman build --format docker ...
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# the package index pip installs from (empty: PyPI), hosts trusted without TLS verification
# (empty: none); a CA bundle for the index comes as the build secret "ca" (never a layer)
ARG PIP_INDEX_URL=""
ARG PIP_EXTRA_INDEX_URL=""
ARG PIP_TRUSTED_HOST=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# only what the packages are built from (see [tool.setuptools] in pyproject.toml and in
# packages/worker/pyproject.toml: the client package awooop-worker, which the server requires),
# the lock and the pinned uv that reads it
COPY pyproject.toml uv.lock README.md ./
COPY scripts/uv-requirements.txt ./scripts/
COPY packages ./packages
COPY services ./services
# Exactly what uv.lock says (docs/dependencies.md): uv (hash-pinned) exports the runtime set with
# hashes, pip installs it with --require-hashes from whichever index is configured (a mirror serves
# the same files: the hashes decide), then the two packages themselves without resolving anything.
RUN --mount=type=secret,id=ca,required=false \
    set -e; \
    [ -n "$PIP_INDEX_URL" ] || unset PIP_INDEX_URL; \
    [ -n "$PIP_EXTRA_INDEX_URL" ] || unset PIP_EXTRA_INDEX_URL; \
    [ -n "$PIP_TRUSTED_HOST" ] || unset PIP_TRUSTED_HOST; \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip install --require-hashes --no-deps --target /tmp/uv -r scripts/uv-requirements.txt; \
    /tmp/uv/bin/uv export --frozen --no-emit-workspace --no-dev --no-header -q -o /tmp/requirements.txt; \
    pip install --require-hashes --no-deps -r /tmp/requirements.txt; \
    pip install --no-deps ./packages/worker .; \
    pip check; \
    rm -rf /tmp/uv /tmp/requirements.txt \
 && useradd --system --uid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin awooop \
 && install -d -o 10001 -m 0700 /var/lib/awooop/keys

USER 10001

# The internal service key lives here: `awooop admin ensure-service-key --file
# /var/lib/awooop/keys/internal-api-key` writes it and AWOOOP_INTERNAL_API_KEY_FILE reads it
# (docker-compose.yml mounts one volume here in both). A fresh named volume takes this
# directory's owner, so the non-root user can write it.

# inside a container the listeners must be reachable from other containers
ENV AWOOOP_HOST=0.0.0.0
# gRPC: ingest, scheduler, saga, reference tool gateway; then Prometheus /metrics, ingest's HTTP
# endpoint and the operator console (HTTP)
EXPOSE 50051 50052 50053 50054 9464 8080 8081

# matches the default command; docker-compose.yml sets one per service. OCI images (podman's
# default format) have no HEALTHCHECK: build with `podman build --format docker` to keep it.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["awooop", "health", "127.0.0.1:50051", "--service", "ingest", "--quiet"]

CMD ["awooop", "serve", "ingest"]
