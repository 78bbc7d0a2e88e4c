# syntax=docker/dockerfile:1
# The starttrace service (`starttrace serve`): OTLP/HTTP receiver, run store, web pages and
# Prometheus /metrics. No torch, no vLLM: the service only reads spans and journals.
#
#   docker build -t starttrace:local .
#   docker run --rm -p 127.0.0.1:8318:4318 -v starttrace-data:/data starttrace:local
#
# Inside the container the server binds 0.0.0.0 so that other containers (the collector,
# Prometheus) reach it; publish it on the host's loopback only (127.0.0.1:...).

FROM python:3.11.14-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# An unprivileged user with a fixed uid/gid (10001), owner of the data volume.
RUN groupadd --system --gid 10001 starttrace \
    && useradd --system --uid 10001 --gid starttrace --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin starttrace \
    && mkdir -p /data/journal \
    && chown -R starttrace:starttrace /data

# .dockerignore lets only pyproject.toml, README.md , starttrace/ and starttrace.pth into the build context.
COPY . /tmp/starttrace-src
# clickhouse-connect: `serve --clickhouse http://...` (starttrace-fleet in docker-compose.yml reads
# runs from ClickHouse); the embedded engine chdb (500 MB) stays out of the image.
RUN pip install --no-cache-dir /tmp/starttrace-src "clickhouse-connect==1.12.0" \
    && rm -rf /tmp/starttrace-src

USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
EXPOSE 4318

HEALTHCHECK --interval=10s --timeout=5s --start-period=15s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:4318/healthz', timeout=3)"]

ENTRYPOINT ["starttrace", "serve", "--host", "0.0.0.0", "--port", "4318", "--db", "/data/starttrace.db"]
CMD ["--journal-dir", "/data/journal"]
