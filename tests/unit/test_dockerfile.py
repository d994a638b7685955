"""What can be checked of the Dockerfile without a Docker engine."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_runs_as_a_non_root_user() -> None:
    users = [rest for word, rest in instructions() if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_copies_only_paths_that_exist() -> None:
    for word, rest in instructions():
        if word == "COPY" and "--from" not in rest:
            *sources, _dest = rest.split()
            for src in sources:
                assert (ROOT / src).exists(), f"COPY {src}: no such path in the repository"


def test_every_entry_point_is_installed_by_the_image() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"dedup-worker", "dedup-operator", "dedup-reconcile", "dedupctl"} <= set(scripts)
    assert all(name.startswith("dedup") for name in scripts)
    assert 'pip install ".[spark]"' in DOCKERFILE, "the image installs the project with Spark"
    assert "/opt/dedup/bin" in DOCKERFILE


def test_java_only_as_a_headless_runtime() -> None:
    assert "openjdk-17-jre-headless" in DOCKERFILE
    assert "jdk " not in DOCKERFILE.replace("openjdk-17-jre-headless", "")


def test_base_images_are_pinned_to_a_release() -> None:
    for word, rest in instructions():
        if word == "FROM":
            image = rest.split()[0]
            assert ":" in image and not image.endswith(":latest"), image


def test_the_entrypoint_runs_spark_executors_with_the_kafka_jars() -> None:
    entry = [rest for word, rest in instructions() if word == "ENTRYPOINT"]
    assert entry and "dedup-entrypoint" in entry[-1]
    assert "DEDUP_SPARK_JARS=" in DOCKERFILE
    pins = dict(
        line.split("#")[0].strip().split("=", 1)
        for line in (ROOT / "versions.env").read_text().splitlines()
        if "=" in line.split("#")[0]
    )
    scala, spark = pins["SPARK_SCALA_VERSION"], pins["SPARK_VERSION"]
    assert f"spark-sql-kafka-0-10_{scala}:{spark}" in DOCKERFILE, "Dockerfile pins versions.env's"
