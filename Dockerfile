# One image with every entry point: dedup-worker, dedup-operator, dedup-audit (and its old
# name dedup-reconcile), dedup-backfill, dedupctl; `dedup-entrypoint driver|executor`
# makes it a Spark image too (as Spark's own image does). What production runs and
# nothing else: no test harness.
#
# - Non-root: UID/GID 65532 (user `dedup`, home /home/dedup), the same UID the operator
#   puts in the pods' securityContext (dedup_contract.names.RUN_AS_USER).
# - Works with a read-only root filesystem: the writable paths are volumes (the store
#   at /var/lib/dedup, scratch at /tmp); nothing is written under /opt or $HOME.
# - Java only for the Spark jobs (Debian's headless JRE).
#
# The base images are build arguments whose defaults are the official images. Where no
# registry is reachable, `make setup-image` (local/dedup_local/image.py) builds
# equivalent bases from Debian packages and passes them here with --build-arg.
ARG MAVEN_IMAGE=maven:3.9.9-eclipse-temurin-17
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Spark's Kafka source and what pyspark does not bundle, by Maven coordinates from Maven
# Central (the same set scripts/setup-spark.sh caches for local runs).
FROM ${MAVEN_IMAGE} AS spark-jars
RUN for a in org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0 \
             org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.0.0 \
             org.apache.kafka:kafka-clients:3.9.0 \
             org.apache.commons:commons-pool2:2.12.0; do \
      mvn -q org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy \
        -Dartifact="$a" -DoutputDirectory=/jars || exit 1; \
    done

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# A C compiler for the project's one extension (dedup_contract._murmur2), in this stage
# only: gcc, and Python's headers where the base lacks them (the official image has
# them; a base of Debian's python3.11 needs python3.11-dev).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && if [ ! -e "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then \
      apt-get install -y --no-install-recommends python3.11-dev; fi \
 && rm -rf /var/lib/apt/lists/*
# The dependencies first, in their own layer (a code change does not re-install them):
# exactly the requirements pyproject.toml lists ([project] dependencies and [spark]).
COPY pyproject.toml ./
RUN python3 -m venv /opt/dedup \
 && python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['spark']))" > /tmp/requirements.txt \
 && /opt/dedup/bin/pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
COPY README.md versions.env ./
COPY contract ./contract
COPY operator ./operator
COPY worker ./worker
COPY spark ./spark
COPY ctl ./ctl
RUN /opt/dedup/bin/pip install --no-deps . \
 && /opt/dedup/bin/python -m compileall -q /opt/dedup/lib

FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 dedup \
 && useradd --uid 65532 --gid 65532 --no-log-init --home-dir /home/dedup --create-home \
      --shell /usr/sbin/nologin dedup \
 && mkdir -p /var/lib/dedup && chown 65532:65532 /var/lib/dedup
COPY --from=spark-jars /jars /opt/dedup/spark-jars
COPY --from=build /opt/dedup /opt/dedup
ENV PATH=/opt/dedup/bin:$PATH \
    DEDUP_SPARK_JARS=/opt/dedup/spark-jars \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DEDUP_STORE_PATH=/var/lib/dedup/store \
    DEDUP_METRICS_PORT=9400
USER 65532:65532
WORKDIR /home/dedup
EXPOSE 9400
# Like Spark's image: `driver` and `executor` start Spark's driver (spark-submit in client
# mode, as cluster mode's driver pod does) and executor; anything else runs as given.
ENTRYPOINT ["/usr/bin/tini", "--", "dedup-entrypoint"]
CMD ["dedup-worker", "--help"]
