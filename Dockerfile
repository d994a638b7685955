# One image with every entry point: dedup-worker, dedup-operator, dedup-reconcile,
# dedup-backfill, dedupctl; `dedup-entrypoint executor` makes it a Spark executor image too.
# Non-root, slim; Java only for the Spark jobs (headless JRE from Debian).
# Checked without a Docker engine by tests/unit/test_dockerfile.py.

# Spark's Kafka source and what pyspark does not bundle, by Maven coordinates from Maven
# Central (the same set scripts/setup-spark.sh caches for local runs).
FROM maven:3.9.9-eclipse-temurin-17 AS spark-jars
RUN for a in org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0 \
             org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.0.0 \
             org.apache.kafka:kafka-clients:3.9.0 \
             org.apache.commons:commons-pool2:2.12.0; do \
      mvn -q org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy \
        -Dartifact="$a" -DoutputDirectory=/jars || exit 1; \
    done

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
COPY --from=spark-jars /jars /opt/dedup/spark-jars
ENV PATH=/opt/dedup/bin:$PATH \
    DEDUP_SPARK_JARS=/opt/dedup/spark-jars \
    PYTHONUNBUFFERED=1 \
    DEDUP_STORE_PATH=/var/lib/dedup/store \
    DEDUP_METRICS_PORT=9400
USER 10001:10001
WORKDIR /home/dedup
EXPOSE 9400
# Like Spark's image: `executor` starts a Spark executor (the pods a driver creates),
# anything else runs as given.
ENTRYPOINT ["/usr/bin/tini", "--", "dedup-entrypoint"]
CMD ["dedup-worker", "--help"]
