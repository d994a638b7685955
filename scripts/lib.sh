# Shared shell helpers for the setup scripts. Source it; do not run it.
# Everything fetched or built lives under $DEDUP_CACHE, outside the repository.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DEDUP_CACHE="${DEDUP_CACHE:-$HOME/.cache/dedup-operator}"
mkdir -p "$DEDUP_CACHE"
# shellcheck source=../versions.env
source "$REPO_ROOT/versions.env"

log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The URL of Maven Central as this Maven installation's super POM names it (override
# with MAVEN_CENTRAL_URL, e.g. for a corporate mirror).
maven_central_url() {
  if [[ -n "${MAVEN_CENTRAL_URL:-}" ]]; then
    echo "$MAVEN_CENTRAL_URL"
    return
  fi
  local home jar
  home="$(mvn -v 2>/dev/null | sed -n 's/^Maven home: //p')"
  jar="$(ls "$home"/lib/maven-model-builder-*.jar 2>/dev/null | head -n1)"
  [[ -n "$jar" ]] || die "cannot find Maven's super POM under '$home'; set MAVEN_CENTRAL_URL"
  unzip -p "$jar" org/apache/maven/model/pom-4.0.0.xml |
    sed -n 's#.*<url>\(https://[^<]*\)</url>.*#\1#p' | head -n1
}

# Writes a Maven settings.xml into directory $1 that sends every repository to Maven
# Central (a POM's extra repositories, such as the GCS mirror in Spark's parent POM, may
# be unreachable) and prints its path; DEDUP_MAVEN_SETTINGS names your own instead.
maven_settings() {
  if [[ -n "${DEDUP_MAVEN_SETTINGS:-}" ]]; then
    echo "$DEDUP_MAVEN_SETTINGS"
    return
  fi
  local url
  url="$(maven_central_url)"
  cat >"$1/settings.xml" <<EOF
<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors>
    <mirror><id>central-only</id><mirrorOf>*</mirrorOf><url>$url</url></mirror>
  </mirrors>
</settings>
EOF
  echo "$1/settings.xml"
}
