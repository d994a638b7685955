"""What can be checked of the Dockerfile by reading it (tests/integration/test_image.py
builds and runs it)."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
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
    assert {"dedup-worker", "dedup-operator", "dedup-audit", "dedupctl"} <= set(scripts)
    # the project's commands, and kubectl's plugin name for dedupctl
    assert all(name.startswith("dedup") or name == "kubectl-dedup" for name in scripts)
    # the [spark] requirements, then the project itself (with its C extension)
    assert "p['optional-dependencies']['spark']" in DOCKERFILE, "the image installs Spark"
    assert "pip install --no-deps ." in DOCKERFILE
    assert "/opt/dedup/bin" in DOCKERFILE


def test_every_entry_point_loads() -> None:
    """Each [project.scripts] target is a function of the checkout (a moved module fails
    here, not in the image)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        assert callable(EntryPoint(name, target, "console_scripts").load()), name


def test_the_audit_still_runs_under_its_old_name(capsys: pytest.CaptureFixture[str]) -> None:
    """`dedup-reconcile`, the audit's name before `dedup-audit`: Jobs of CronJobs an older
    operator rendered still call it."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["dedup-reconcile"] == scripts["dedup-audit"] == "dedup_spark.audit_job:main"
    main = EntryPoint("dedup-reconcile", scripts["dedup-reconcile"], "console_scripts").load()
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    assert "--pipeline" in capsys.readouterr().out


def test_java_only_as_a_headless_runtime() -> None:
    assert "openjdk-17-jre-headless" in DOCKERFILE
    assert "jdk " not in DOCKERFILE.replace("openjdk-17-jre-headless", "")


def test_base_images_are_build_arguments_defaulting_to_pinned_releases() -> None:
    defaults = {
        name: value
        for word, rest in instructions()
        if word == "ARG" and "=" in rest
        for name, value in [rest.split("=", 1)]
    }
    for word, rest in instructions():
        if word == "FROM":
            image = rest.split()[0]
            if image.startswith("${"):
                image = defaults[image[2:-1]]
            assert ":" in image and not image.endswith(":latest"), image
    assert defaults["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    assert defaults["MAVEN_IMAGE"].startswith("maven:")


def test_the_image_user_is_the_pods_user() -> None:
    from dedup_contract.names import RUN_AS_USER

    users = [rest for word, rest in instructions() if word == "USER"]
    assert users[-1] == f"{RUN_AS_USER}:{RUN_AS_USER}"
    assert f"--uid {RUN_AS_USER} --gid {RUN_AS_USER}" in DOCKERFILE


def test_the_build_context_holds_no_test_harness() -> None:
    from dedup_local.image import context_files

    files = {str(p.relative_to(ROOT)) for p in context_files(ROOT)}
    assert "pyproject.toml" in files and "worker/dedup_worker/loop.py" in files
    for prefix in ("local/", "tests/", "bench/", "scripts/", ".git/", "crds/"):
        assert not any(f.startswith(prefix) for f in files), prefix
    assert not any("__pycache__" in f for f in files)
    assert "COPY local" not in DOCKERFILE


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
