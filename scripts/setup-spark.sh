#!/usr/bin/env bash
# Fetches Spark's Kafka source (org.apache.spark:spark-sql-kafka-0-10_$SPARK_SCALA_VERSION
# at $SPARK_VERSION) from Maven Central with the runtime dependencies that pyspark does not
# already bundle (kafka-clients, spark-token-provider-kafka, commons-pool2, ...) into
# $DEDUP_CACHE/spark-kafka-$SPARK_VERSION/jars. A local SparkSession puts those jars on
# spark.jars (see local/dedup_local/spark.py), so nothing is downloaded at run time.
# A dependency that pyspark bundles (at any version) is left out: pyspark's copy wins.
# Idempotent: a stamp records what was fetched; a second run returns at once.
source "$(dirname "$0")/lib.sh"

DEST="$DEDUP_CACHE/spark-kafka-$SPARK_VERSION"
JARS="$DEST/jars"
STAMP="$DEST/.stamp"
M2="$DEDUP_CACHE/m2"
PY="$DEDUP_CACHE/venv/bin/python"
DEP_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
COORD="org.apache.spark:spark-sql-kafka-0-10_${SPARK_SCALA_VERSION}:${SPARK_VERSION}"

[[ -x "$PY" ]] || die "spark: no virtual environment at $DEDUP_CACHE/venv (run: make setup-python)"
# pyspark/version.py only: importing pyspark itself takes a while.
pyspark_info="$("$PY" -c 'import importlib.util as u, os, sys
spec = u.find_spec("pyspark")
if spec is None or spec.origin is None: sys.exit(1)
d = os.path.dirname(spec.origin); ns = {}
exec(open(os.path.join(d, "version.py")).read(), ns)
print(ns["__version__"]); print(d)' 2>/dev/null)" ||
  die "spark: pyspark is not installed in $DEDUP_CACHE/venv (run: make setup-python)"
pyspark_version="$(sed -n 1p <<<"$pyspark_info")"
pyspark_dir="$(sed -n 2p <<<"$pyspark_info")"
[[ "$pyspark_version" == "$SPARK_VERSION" ]] ||
  die "spark: pyspark $pyspark_version installed but versions.env pins $SPARK_VERSION (run: make setup-python)"
bundled="$pyspark_dir/jars"

want="$COORD pyspark:$pyspark_version:$bundled v2"
cached() { [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -d "$JARS" ]]; }
reuse() {
  log "spark: reusing $JARS ($(find "$JARS" -name '*.jar' | wc -l) jars)"
  exit 0
}
if cached; then
  reuse
fi
# One fetch at a time (e.g. make -j); whoever waited finds the result cached.
mkdir -p "$DEST"
exec 9>"$DEST/.lock"
command -v flock >/dev/null && flock 9
if cached; then
  reuse
fi

command -v mvn >/dev/null || die "mvn not found (needed to fetch the Spark Kafka source from Maven Central)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

settings="$(maven_settings "$work")"
cat >"$work/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.dedup</groupId>
  <artifactId>spark-kafka-jars</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_${SPARK_SCALA_VERSION}</artifactId>
      <version>${SPARK_VERSION}</version>
    </dependency>
  </dependencies>
</project>
EOF

mvn_run() { # goal args... ; quiet, with the log shown on failure
  mvn -B -q -s "$settings" -Dmaven.repo.local="$M2" "$@" >"$work/mvn.log" 2>&1 || {
    tail -n 40 "$work/mvn.log" >&2
    die "spark: maven could not resolve $COORD"
  }
}

# 1. The dependency graph only (POMs, no jars), so nothing pyspark bundles is downloaded.
log "spark: resolving $COORD and runtime dependencies from Maven Central"
mvn_run -f "$work/pom.xml" "$DEP_PLUGIN:collect" -DincludeScope=runtime -DoutputFile="$work/deps.txt"

# 2. Keep what pyspark does not bundle (at any version: pyspark's copy wins).
# Lines look like "   group:artifact:jar:version:scope" (maybe followed by " -- module ...").
needed=()
while IFS=: read -r group artifact type version _; do
  [[ "$type" == "jar" ]] || continue
  shopt -s nullglob
  have=("$bundled/$artifact"-[0-9]*.jar)
  shopt -u nullglob
  if ((${#have[@]})); then
    log "spark:   bundled by pyspark: $group:$artifact:$version (has $(basename "${have[0]}"))"
  else
    log "spark:   fetching $group:$artifact:$version"
    needed+=("$group:$artifact:$version")
  fi
done < <(sed -nE 's/^[[:space:]]+([^[:space:]]+:[^[:space:]]+:jar:[^[:space:]]+).*$/\1/p' "$work/deps.txt")
((${#needed[@]})) || die "spark: empty dependency list for $COORD (see $work/deps.txt)"

# 3. Download exactly those jars, each without its own dependencies (already decided above).
{
  echo '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
  echo '<groupId>local.dedup</groupId><artifactId>spark-kafka-copy</artifactId><version>0</version>'
  echo '<packaging>pom</packaging><dependencies>'
  for gav in "${needed[@]}"; do
    IFS=: read -r g a v <<<"$gav"
    echo "<dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version>"
    echo "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions></dependency>"
  done
  echo '</dependencies></project>'
} >"$work/copy-pom.xml"
rm -rf "$JARS.tmp"
mvn_run -f "$work/copy-pom.xml" "$DEP_PLUGIN:copy-dependencies" -DoutputDirectory="$JARS.tmp"

[[ -f "$JARS.tmp/spark-sql-kafka-0-10_${SPARK_SCALA_VERSION}-${SPARK_VERSION}.jar" ]] ||
  die "spark: spark-sql-kafka jar missing after resolve (see the dependency list above)"
rm -f "$STAMP"
rm -rf "$JARS"
mv "$JARS.tmp" "$JARS"
echo "$want" >"$STAMP"
log "spark: ready in $JARS ($(find "$JARS" -name '*.jar' | wc -l) jars, $(du -sh "$JARS" | cut -f1)):"
for jar in "$JARS"/*.jar; do log "spark:   $(basename "$jar")"; done
