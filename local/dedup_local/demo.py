"""`make demo`: the main job on the embedded local default.

1. starts a real Kafka broker and a real control plane (etcd + kube-apiserver) from the
   cache, installs the DedupPipeline CRD and applies `examples/events-pipeline.yaml`
   (and shows an invalid one being refused by the API);
2. creates the pipeline's topics with 3 partitions and produces events keyed by message
   id, with duplicates near and far and a few malformed records;
3. runs one `dedup-worker` per partition, SIGKILLs one mid-stream and restarts it;
4. reads the output back with an independent read_committed consumer and checks that
   every valid id is there exactly once, and every malformed record is dead-lettered.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from confluent_kafka import Message, Producer

from dedup_local.kafka import KafkaBroker, committed_offsets
from dedup_local.kube import ControlPlane
from dedup_local.paths import REPO_ROOT
from dedup_local.worker import start_worker
from dedup_worker.config import WorkerConfig
from dedup_worker.ids import ID_HEADER, partition_for
from dedup_worker.loop import DLQ_REASON
from dedup_worker.window import WindowPolicy, parse_duration_ms

PARTITIONS = 3
EVENTS = 30_000
DUPLICATE_SHARE = 0.05
MALFORMED = 12


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def show_api(plane: ControlPlane) -> None:
    plane.kubectl("apply", "-f", str(REPO_ROOT / "crds"))
    plane.kubectl(
        "wait", "--for=condition=Established", "crd/deduppipelines.dedup.io", "--timeout=60s"
    )
    plane.kubectl("apply", "-f", str(REPO_ROOT / "examples" / "events-pipeline.yaml"))
    say("DedupPipeline applied:\n" + plane.kubectl("get", "dp", "-o", "wide").stdout.rstrip())
    bad = (
        (REPO_ROOT / "examples" / "events-pipeline.yaml")
        .read_text()
        .replace("partitions: 3", "partitions: 0")
    )
    bad = bad.replace("name: events", "name: broken")
    refused = plane.kubectl("apply", "-f", "-", input=bad, check=False)
    say(
        "an invalid one is refused by the API server:\n  "
        + refused.stderr.strip().replace("\n", "\n  ")
    )


def produce_events(bootstrap: str, rng: random.Random) -> tuple[list[str], int]:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 10, "enable.idempotence": True}
    )
    sent: list[str] = []
    uniques = 0
    for n in range(EVENTS):
        if sent and rng.random() < DUPLICATE_SHARE:
            message_id = sent[-rng.randint(1, min(len(sent), 5000))]  # a client retry
        else:
            message_id = f"order-{uniques:06d}"
            uniques += 1
        sent.append(message_id)
        value = json.dumps({"messageId": message_id, "amount": rng.randint(1, 500), "n": n})
        producer.produce(
            "events",
            value=value.encode(),
            key=message_id.encode(),
            partition=partition_for(message_id, PARTITIONS),
        )
        if n % 10_000 == 0:
            producer.poll(0)
    for i in range(MALFORMED):
        producer.produce(
            "events",
            value=b'{"amount": 3, "no-id": true' if i % 2 else b"\xff\xfe",
            partition=i % PARTITIONS,
        )
    producer.flush(60)
    return sent, MALFORMED


def worker(bootstrap: str, partition: int, state: Path, log: Path) -> subprocess.Popen[bytes]:
    config = WorkerConfig(
        bootstrap_servers=bootstrap,
        pipeline="events",
        input_topic="events",
        output_topic="events-deduped",
        dead_letter_topic="events-dlq",
        partition=partition,
        store_path=state / f"events-p{partition}",
        window=WindowPolicy(duration_ms=parse_duration_ms("672h")),
    )
    return start_worker(config, log)


def header(msg: Message, name: str) -> str:
    value: bytes = dict(msg.headers() or [])[name]
    return value.decode()


def committed(bootstrap: str) -> int:
    offsets = committed_offsets(bootstrap, "dedup-events", "events", range(PARTITIONS))
    return sum(max(0, offset) for offset in offsets)


def main() -> int:
    rng = random.Random(42)
    with (
        tempfile.TemporaryDirectory(prefix="dedup-demo-") as tmp,
        KafkaBroker() as kafka,
        ControlPlane(with_controllers=False) as plane,
    ):
        state = Path(tmp)
        say(f"Kafka broker at {kafka.bootstrap}; kube-apiserver at {plane.server}")
        show_api(plane)
        for topic in ("events", "events-deduped", "events-dlq"):
            kafka.create_topic(topic, PARTITIONS)
        sent, malformed = produce_events(kafka.bootstrap, rng)
        say(
            f"produced {len(sent)} events ({len(sent) - len(set(sent))} duplicates) and {malformed} malformed records"
        )
        log = state / "workers.log"
        workers = {p: worker(kafka.bootstrap, p, state, log) for p in range(PARTITIONS)}
        time.sleep(2.5)
        workers[1].send_signal(signal.SIGKILL)
        workers[1].wait()
        say("SIGKILLed the worker of partition 1 mid-stream; restarting it on the same store")
        workers[1] = worker(kafka.bootstrap, 1, state, log)
        total = len(sent) + malformed
        deadline = time.monotonic() + 300
        while committed(kafka.bootstrap) < total:
            if time.monotonic() > deadline or any(w.poll() is not None for w in workers.values()):
                codes = {p: w.poll() for p, w in workers.items()}
                say(
                    f"workers did not finish (exit codes {codes}); their log:\n{log.read_text()[-3000:]}"
                )
                return 1
            time.sleep(0.5)
        for w in workers.values():
            w.terminate()
            w.wait(30)
        out = kafka.read_committed("events-deduped")
        dead = kafka.read_committed("events-dlq")
        ids = [header(m, ID_HEADER) for m in out]
        expected = set(sent)
        ok = len(ids) == len(set(ids)) and set(ids) == expected and len(dead) == malformed
        say(f"input records           {total}")
        say(f"distinct valid ids      {len(expected)}")
        say(f"published               {len(ids)}")
        say(f"duplicates dropped      {len(sent) - len(ids)}")
        say(
            f"dead-lettered           {len(dead)} (reasons: {sorted({header(m, DLQ_REASON) for m in dead})})"
        )
        say("exactly once: " + ("YES, every id once, nothing lost" if ok else "NO"))
        return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
