"""The built image, run as users run it: podman (runc) from the image `make setup-image`
built from the Dockerfile, as its non-root user with a read-only root filesystem, the
host's network (a 127.x address of its own), and volumes for what it writes.

- every entry point answers `--help`;
- a worker container deduplicates a partition of the real broker: the output holds each
  valid id once in input order, the malformed record is dead-lettered, a SIGTERM stops it
  with exit 0 and its store on the volume belongs to the image's user;
- a Spark executor from the image: test_operator_reconciliation.py runs the audit's
  driver and executors as containerd containers of this image on the real nodes.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dedup_contract.names import RUN_AS_USER
from dedup_local.image import DEV_TAG, ensure_image, podman, podman_env
from dedup_local.kafka import KafkaBroker
from dedup_local.paths import free_port
from dedup_operator.desired.scheduled_audit import APPLICATION_FILE
from support.worker_helpers import event, output_ids, produce, read_committed, unique

pytestmark = [pytest.mark.integration, pytest.mark.cluster_group("kafka-spark")]

ENTRY_POINTS = (
    "dedup-worker",
    "dedup-operator",
    "dedup-audit",
    "dedup-reconcile",  # the audit's old name, an alias
    "dedup-backfill",
)


@pytest.fixture(scope="module")
def image() -> str:
    return ensure_image()


def run(
    image: str, *args: str, options: tuple[str, ...] = (), timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "run", "--rm", "--read-only", "--network", "host", *options, image, *args],
        env=podman_env(), capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_each_entry_point_answers_help(image: str, entry_point: str) -> None:
    result = run(image, entry_point, "--help")
    assert result.returncode == 0, result.stderr
    assert f"usage: {entry_point}" in result.stdout


def test_the_image_runs_as_its_user_with_java_and_the_kafka_jars(image: str) -> None:
    result = run(
        image,
        "sh",
        "-c",
        'id -u; id -g; echo "$HOME"; java -version 2>&1 | head -1; ls "$DEDUP_SPARK_JARS"',
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stderr
    assert lines[:3] == [str(RUN_AS_USER), str(RUN_AS_USER), "/home/dedup"]
    assert "openjdk" in lines[3]
    assert any(line.startswith("spark-sql-kafka-0-10_2.13") for line in lines[4:])
    # The application file a ScheduledSparkApplication names is where the image has it.
    application = APPLICATION_FILE.removeprefix("local://")
    assert run(image, "test", "-f", application).returncode == 0, application
    # No test harness in the image.
    missing = run(image, "python", "-c", "import dedup_local")
    assert missing.returncode != 0 and "No module named 'dedup_local'" in missing.stderr
    # The dev tag names the same image as the inputs' tag.
    ids = {
        podman("image", "inspect", "--format", "{{.Id}}", ref).stdout for ref in (image, DEV_TAG)
    }
    assert len(ids) == 1


@pytest.fixture
def store_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "store"
    directory.mkdir()
    directory.chmod(0o777)
    yield directory


def test_a_worker_container_deduplicates_a_partition_exactly(
    image: str, kafka: KafkaBroker, store_dir: Path
) -> None:
    name = unique("image-worker")
    for suffix in ("in", "out", "dlq"):
        kafka.create_topic(f"{name}-{suffix}", 1)
    # 600 ids, every tenth sent twice (the repeat right after), one record without an id.
    ids = [f"id-{i}" for i in range(600)]
    values: list[bytes | None] = []
    for i, message_id in enumerate(ids):
        values.append(event(message_id, i))
        if i % 10 == 0:
            values.append(event(message_id, i))
    values.insert(300, b"{not json")
    produce(kafka.bootstrap, f"{name}-in", values)

    port = free_port()
    container = f"{name}-worker"
    started = subprocess.run(
        ["podman", "run", "--detach", "--name", container, "--read-only", "--network", "host",
         "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
         "--mount", f"type=bind,src={store_dir},dst=/var/lib/dedup",
         "--tmpfs", "/tmp", image,
         "dedup-worker", "--bootstrap-servers", kafka.bootstrap,
         "--input-topic", f"{name}-in", "--output-topic", f"{name}-out",
         "--dead-letter-topic", f"{name}-dlq", "--partition", "0", "--pipeline", name,
         "--window-duration", "24h", "--metrics-address", "127.0.0.1",
         "--metrics-port", str(port), "--log-format", "text"],
        env=podman_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 120
        published: list[str] = []
        while time.monotonic() < deadline:
            published = output_ids(kafka.bootstrap, f"{name}-out")
            if len(published) >= len(ids):
                break
            time.sleep(1)
        stopped = subprocess.run(
            ["podman", "stop", "--time", "30", container],
            env=podman_env(), capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
        assert stopped.returncode == 0, stopped.stderr
        code = podman("inspect", "--format", "{{.State.ExitCode}}", container).stdout.strip()
        logs = podman("logs", container).stderr + podman("logs", container).stdout
    finally:
        podman("rm", "--force", container, check=False)
    assert code == "0", logs[-3000:]
    # The oracle: each id of the input, once, in input order (read independently).
    assert output_ids(kafka.bootstrap, f"{name}-out") == ids, logs[-3000:]
    dead = read_committed(kafka.bootstrap, f"{name}-dlq")
    assert [m.value() for m in dead] == [b"{not json"]
    assert {k: v for k, v in dead[0].headers() or []}.get("dedup.reason")
    # The store was written by the image's user onto the volume.
    owners = {p.stat().st_uid for p in store_dir.rglob("*")}
    assert owners == {RUN_AS_USER}, owners
    assert json.dumps(sorted(p.name for p in store_dir.iterdir()))


def test_the_driver_mode_starts_spark_submit_in_client_mode(image: str, tmp_path: Path) -> None:
    """`dedup-entrypoint driver <spark-submit args>`, as Spark's cluster mode starts a
    driver pod: here with a local master and a one-line application (a driver pod's
    master is the API server, tested by the audit's Spark-on-Kubernetes test)."""
    app = tmp_path / "app.py"
    app.write_text(
        "from pyspark.sql import SparkSession\n"
        "spark = SparkSession.builder.getOrCreate()\n"
        "print('counted', spark.range(1000).count(), spark.sparkContext.getConf().get('spark.submit.deployMode'))\n"
    )
    app.chmod(0o644)
    tmp_path.chmod(0o755)  # the image's user reads it
    result = run(
        image, "driver", "--master", "local[1]", "/app/app.py",
        timeout=300,  # a JVM and a SparkSession on a machine busy with other tests
        options=("--tmpfs", "/tmp", "--env", "SPARK_DRIVER_BIND_ADDRESS=127.0.0.1",
                 "--env", "SPARK_LOCAL_IP=127.0.0.1",
                 "--mount", f"type=bind,src={tmp_path},dst=/app,ro=true"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "counted 1000 client" in result.stdout, result.stdout[-2000:]
