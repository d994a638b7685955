# One image with every entry point: dedup-worker, dedup-operator, dedup-reconcile, dedupctl.
# Non-root, slim; Java only for the Spark jobs (headless JRE from Debian).
# Checked without a Docker engine by tests/unit/test_dockerfile.py.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md versions.env ./
COPY operator ./operator
COPY worker ./worker
COPY spark ./spark
COPY local ./local
RUN python -m venv /opt/dedup \
 && /opt/dedup/bin/pip install --upgrade pip \
 && /opt/dedup/bin/pip install ".[spark]"

FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 dedup \
 && useradd --system --uid 10001 --gid dedup --home-dir /home/dedup --create-home dedup \
 && mkdir -p /var/lib/dedup && chown dedup:dedup /var/lib/dedup
COPY --from=build /opt/dedup /opt/dedup
ENV PATH=/opt/dedup/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    DEDUP_STORE_PATH=/var/lib/dedup/store \
    DEDUP_METRICS_PORT=9400
USER 10001:10001
WORKDIR /home/dedup
EXPOSE 9400
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["dedup-worker", "--help"]
