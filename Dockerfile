# One image for every awooop service: `awooop serve ingest|scheduler|saga|gateway`,
# `awooop migrate`, `awooop admin ...` and `awooop health` (the healthcheck).
# docker-compose.yml runs it; ports and variables are in docs/configuration.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# only what the package is built from (see [tool.setuptools] in pyproject.toml)
COPY pyproject.toml README.md ./
COPY gen ./gen
COPY sdk ./sdk
COPY services ./services
RUN pip install . \
 && useradd --system --uid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin awooop

USER 10001

# inside a container the listeners must be reachable from other containers
ENV AWOOOP_HOST=0.0.0.0
# gRPC: ingest, scheduler, saga, reference tool gateway; then Prometheus /metrics
EXPOSE 50051 50052 50053 50054 9464 8080

# matches the default command; docker-compose.yml sets one per service
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["awooop", "health", "127.0.0.1:50051", "--service", "ingest", "--quiet"]

CMD ["awooop", "serve", "ingest"]
