#!/usr/bin/env bash
# Fetches the Apache Kafka broker (KRaft mode, Java) from Maven Central by coordinates
# into $DEDUP_CACHE/kafka-$KAFKA_VERSION/libs: org.apache.kafka:kafka_$KAFKA_SCALA_VERSION
# with its runtime dependencies, plus what the binary distribution adds that the POM
# leaves out: the Log4j 2 binding for SLF4J that the broker logs through.
# The broker main class is kafka.Kafka; the storage format tool, kafka.tools.StorageTool,
# is in the same core jar. kafka-tools (admin CLIs) is left out on purpose: it drags in
# Kafka Connect, Jetty and Jersey (~30 MB) and nothing here runs those CLIs.
# Idempotent: a stamp records what was fetched; a second run returns at once.
source "$(dirname "$0")/lib.sh"

# Log4j 2 as in the Kafka $KAFKA_VERSION binary distribution (Kafka logs through SLF4J 1.7).
LOG4J2_VERSION=2.24.3

DEST="$DEDUP_CACHE/kafka-$KAFKA_VERSION"
LIBS="$DEST/libs"
STAMP="$DEST/.stamp"
M2="$DEDUP_CACHE/m2"
DEP_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

# The stamp names everything that decides the jar set, so editing this list refetches.
want="kafka_${KAFKA_SCALA_VERSION}:${KAFKA_VERSION} log4j2:${LOG4J2_VERSION} v3"
cached() { [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -d "$LIBS" ]]; }
if cached; then
  log "kafka: reusing $LIBS ($(find "$LIBS" -name '*.jar' | wc -l) jars)"
  exit 0
fi
# One fetch at a time (e.g. make -j); whoever waited finds the result cached.
mkdir -p "$DEST"
exec 9>"$DEST/.lock"
command -v flock >/dev/null && flock 9
if cached; then
  log "kafka: reusing $LIBS ($(find "$LIBS" -name '*.jar' | wc -l) jars)"
  exit 0
fi

command -v java >/dev/null || die "java not found (Kafka $KAFKA_VERSION needs Java 17+)"
command -v mvn >/dev/null || die "mvn not found (needed to fetch Kafka from Maven Central)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

settings="$(maven_settings "$work")"
dep() { # groupId artifactId version
  printf '    <dependency><groupId>%s</groupId><artifactId>%s</artifactId><version>%s</version></dependency>\n' "$1" "$2" "$3"
}
{
  cat <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.dedup</groupId>
  <artifactId>kafka-broker-libs</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
EOF
  dep org.apache.kafka "kafka_${KAFKA_SCALA_VERSION}" "$KAFKA_VERSION"
  dep org.apache.logging.log4j log4j-api "$LOG4J2_VERSION"
  dep org.apache.logging.log4j log4j-core "$LOG4J2_VERSION"
  dep org.apache.logging.log4j log4j-slf4j-impl "$LOG4J2_VERSION"
  cat <<EOF
  </dependencies>
</project>
EOF
} >"$work/pom.xml"

log "kafka: resolving kafka_${KAFKA_SCALA_VERSION}:${KAFKA_VERSION} and runtime dependencies from Maven Central"
log "kafka: (first run downloads ~30 MB into $M2)"
rm -rf "$LIBS.tmp"
mvn -B -q -s "$settings" -f "$work/pom.xml" -Dmaven.repo.local="$M2" \
  "$DEP_PLUGIN:copy-dependencies" \
  -DincludeScope=runtime -DoutputDirectory="$LIBS.tmp" >"$work/mvn.log" 2>&1 || {
  tail -n 40 "$work/mvn.log" >&2
  die "kafka: maven could not resolve the broker artifacts"
}
n="$(find "$LIBS.tmp" -name '*.jar' | wc -l)"
[[ -f "$LIBS.tmp/kafka_${KAFKA_SCALA_VERSION}-${KAFKA_VERSION}.jar" ]] || die "kafka: broker jar missing after resolve"
log "kafka: fetched $n jars"

# Check the set is complete: both entry points must load (classes resolve at link time).
log "kafka: checking that kafka.Kafka and kafka.tools.StorageTool load"
for main in "kafka.Kafka --version" "kafka.tools.StorageTool version"; do
  # shellcheck disable=SC2086 # main class and its argument
  java -cp "$LIBS.tmp/*" $main >"$work/check.log" 2>&1 || {
    cat "$work/check.log" >&2
    die "kafka: '$main' does not start from the fetched jars"
  }
done

rm -f "$STAMP"
rm -rf "$LIBS"
mv "$LIBS.tmp" "$LIBS"
echo "$want" >"$STAMP"
log "kafka: ready in $LIBS ($(du -sh "$LIBS" | cut -f1))"
