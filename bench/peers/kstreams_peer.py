"""The Kafka Streams peer of bench/worker_throughput.py: build it, run it.

The peer is the Java program in ``bench/peers/kstreams/`` (see its ``KStreamsDedup.java``
for the job and the store it uses). ``build()`` has Maven compile it against the
``kafka-streams`` of the broker's pinned version (``versions.env`` KAFKA_VERSION) into the
cache, under a directory named by a hash of the pom, the sources and the pin, so it is
rebuilt only when one of them changes; nothing built lands in the repository. ``run()``
starts it with ``java -jar`` as a child process on the bench's broker.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dedup_local.kafka import java_path
from dedup_local.paths import MissingArtifact, cache_dir, versions

SOURCE = Path(__file__).resolve().parent / "kstreams"
JAR = "kstreams-dedup.jar"
# Central, as Maven's super POM names it (scripts/lib.sh does the same for the setup
# scripts); MAVEN_CENTRAL_URL or DEDUP_MAVEN_SETTINGS override it, as they do there.
CENTRAL = "https://repo.maven.apache.org/maven2"


@dataclass(frozen=True)
class PeerResult:
    seconds: float  # start to the last input record committed
    steady_seconds: float  # the first input record processed to the last committed
    records: int
    outputs: int  # records the processor forwarded to the output topic
    dead_letters: int
    close_s: float
    store: str
    topology: str = "plain"
    threads: int = 1

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def steady_records_per_s(self) -> float:
        return self.records / self.steady_seconds


def kafka_version() -> str:
    return versions()["KAFKA_VERSION"]


def source_hash() -> str:
    """A hash of what the jar is built from: the pom, every source file, the Kafka pin."""
    digest = hashlib.sha256(f"kafka={kafka_version()}\n".encode())
    files = [SOURCE / "pom.xml", *sorted((SOURCE / "src").rglob("*"))]
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(SOURCE)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _maven_settings(directory: Path) -> Path:
    own = os.environ.get("DEDUP_MAVEN_SETTINGS")
    if own:
        return Path(own)
    url = os.environ.get("MAVEN_CENTRAL_URL", CENTRAL)
    settings = directory / "settings.xml"
    settings.write_text(
        '<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0"><mirrors>'
        f"<mirror><id>central-only</id><mirrorOf>*</mirrorOf><url>{url}</url></mirror>"
        "</mirrors></settings>\n"
    )
    return settings


def build() -> Path:
    """The peer's jar, built with Maven into the cache unless this source is built already."""
    root = cache_dir() / "kstreams-peer"
    built = root / source_hash()
    jar = built / JAR
    if jar.is_file():
        return jar
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingArtifact("mvn not found (needed to build the Kafka Streams peer)")
    root.mkdir(parents=True, exist_ok=True)
    work = root / f"{built.name}.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    log = work / "mvn.log"
    print(
        f"[bench] building the Kafka Streams peer (kafka-streams {kafka_version()}) with Maven "
        f"into {built} (once per source change; log {log})",
        flush=True,
    )
    started = time.monotonic()
    command = [
        mvn,
        "-B",
        "--no-transfer-progress",
        "-s",
        str(_maven_settings(work)),
        "-f",
        str(SOURCE / "pom.xml"),
        f"-Dmaven.repo.local={cache_dir() / 'm2'}",
        f"-Dpeer.build.dir={work / 'target'}",
        f"-Dkafka.version={kafka_version()}",
        "package",
    ]
    with (
        log.open("w") as out,
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            # progress: one line per plugin step ("[INFO] --- compiler:3.13.0:compile ...")
            if line.startswith("[INFO] --- ") or line.startswith("[ERROR]"):
                print(f"[bench]   {time.monotonic() - started:5.1f}s {line.rstrip()}", flush=True)
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        raise RuntimeError(f"building the Kafka Streams peer failed (see {log}):\n{tail}")
    target = work / "target"
    if not (target / JAR).is_file():
        raise RuntimeError(f"Maven finished but {target / JAR} is missing (see {log})")
    shutil.move(str(log), target / "mvn.log")
    target.rename(built)  # the jar's manifest names its dependencies as lib/*.jar beside it
    shutil.rmtree(work, ignore_errors=True)
    for stale in root.iterdir():  # builds of earlier sources (~70 MB each, mostly RocksDB)
        if stale.is_dir() and stale != built and not stale.name.endswith(".tmp"):
            shutil.rmtree(stale, ignore_errors=True)
    print(f"[bench] built {jar} in {time.monotonic() - started:.0f}s", flush=True)
    return jar


def run(
    bootstrap: str,
    input_topic: str,
    output_topic: str,
    dead_letter_topic: str,
    records: int,
    outputs: int,
    state_dir: Path,
    *,
    store: str = "window",
    window_ms: int = 7 * 24 * 3600 * 1000,
    threads: int = 1,
    topology: str = "plain",
    application_id: str | None = None,
) -> PeerResult:
    """Run the peer until it has committed all ``records`` input records; its timing.
    ``threads`` is its num.stream.threads; ``topology`` "plain" (dedup reads the input)
    or "repartition" (re-key by the id through a repartition topic first);
    ``application_id`` its consumer group and the prefix of its internal topics (default
    ``kstreams-<input>``: a second run on one input needs another)."""
    jar = build()
    command = [
        java_path("the Kafka Streams peer"),
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-jar",
        str(jar),
        bootstrap,
        input_topic,
        output_topic,
        dead_letter_topic,
        str(records),
        str(outputs),
        str(state_dir),
        "--store",
        store,
        "--window-ms",
        str(window_ms),
        "--threads",
        str(threads),
        "--topology",
        topology,
        *(["--application-id", application_id] if application_id else []),
    ]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise RuntimeError(f"the Kafka Streams peer exited with {proc.returncode}")
    for line in proc.stderr.splitlines():
        if line.startswith("[kstreams]"):
            print(line, flush=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return PeerResult(
        seconds=float(result["seconds"]),
        steady_seconds=float(result["steady_seconds"]),
        records=int(result["records"]),
        outputs=int(result["outputs"]),
        dead_letters=int(result["dead_letters"]),
        close_s=float(result["close_s"]),
        store=str(result["store"]),
        topology=str(result.get("topology", "plain")),
        threads=int(result.get("threads", 1)),
    )


if __name__ == "__main__":
    print(build())
