"""spec.py and the CRD agree: the CRD's defaults are the ones `PipelineSpec.parse` assumes,
every defaulted field is read by the code, and the enums match the code's."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import yaml

from dedup_contract.ids import ID_SOURCES
from dedup_local.paths import REPO_ROOT
from dedup_operator.failover import ReleaseVolume
from dedup_operator.spec import LOG_LEVELS, PipelineSpec, SpecError, quantity

CRD = yaml.safe_load((REPO_ROOT / "crds" / "dedup.io_dedupPipelines.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

MINIMAL: dict[str, Any] = {
    "kafka": {
        "bootstrapServers": "k:9092",
        "inputTopic": "a",
        "outputTopic": "b",
        "securityRef": {"secretName": "creds"},
    },
    "partitions": 2,
    "messageId": {"source": "key"},
    "window": {"maxKeys": 1000},
    "reconciliation": {"schedule": "0 3 * * *"},
}


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the apiserver does it: a missing property with a default
    gets it, then defaulting recurses into the objects present."""
    if not isinstance(value, dict) or "properties" not in schema:
        return value
    out = dict(value)
    for key, sub in schema["properties"].items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if key in out:
            out[key] = apply_defaults(sub, out[key])
    return out


def defaulted_paths(
    schema: dict[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    for key, sub in schema.get("properties", {}).items():
        here = (*path, key)
        if "default" in sub and not isinstance(sub["default"], dict):
            yield here
        elif isinstance(sub.get("default"), dict) and sub["default"]:
            for inner in sub["default"]:
                yield (*here, inner)
        yield from defaulted_paths(sub, here)


def parse(spec: dict[str, Any]) -> PipelineSpec:
    return PipelineSpec.parse("events", "ns", spec)


def test_crd_defaults_equal_the_code_defaults() -> None:
    server_side = apply_defaults(SCHEMA, MINIMAL)
    assert server_side != MINIMAL  # the CRD does default something
    assert parse(server_side) == parse(MINIMAL)


def _other(schema: dict[str, Any], value: Any) -> Any:
    if "enum" in schema:
        return next(v for v in schema["enum"] if v != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    return "7" + str(value)  # 760s, 72Gi, 7dedup-operator:0.1.0: still valid


@pytest.mark.parametrize("path", list(defaulted_paths(SCHEMA)), ids="/".join)
def test_every_crd_default_is_read_by_the_code(path: tuple[str, ...]) -> None:
    spec = apply_defaults(SCHEMA, MINIMAL)
    node, schema = spec, SCHEMA
    for key in path[:-1]:
        node, schema = node[key], schema["properties"][key]
    leaf_schema = schema.get("properties", {}).get(path[-1]) or schema["additionalProperties"]
    node[path[-1]] = _other(leaf_schema, node[path[-1]])
    assert parse(spec) != parse(MINIMAL), f"changing {'.'.join(path)} changed nothing"


def _enum(*path: str) -> list[str]:
    node = SCHEMA
    for key in path:
        node = node["properties"][key]
    return list(node["enum"])


def test_enums_match_the_code() -> None:
    assert _enum("messageId", "source") == list(ID_SOURCES)
    assert _enum("failover", "releaseVolume") == [v.value for v in ReleaseVolume]
    assert _enum("worker", "logLevel") == list(LOG_LEVELS)


def test_full_spec_parses_into_typed_values() -> None:
    spec = parse(
        {
            **MINIMAL,
            "messageId": {"source": "jsonField", "field": "meta.id"},
            "window": {"duration": "7d"},
            "worker": {"resources": {"limits": {"cpu": "1500m"}}},
            "failover": {
                "nodeLostAfter": "5s",
                "leaseDuration": "1m",
                "releaseVolume": "WaitForDetach",
            },
        }
    )
    assert spec.kafka.consumer_group == "dedup-events"
    assert spec.kafka.security_ref is not None
    assert spec.kafka.security_ref.key == "kafka-config"
    assert spec.message_id.field == "meta.id"
    assert spec.failover.node_lost_after == timedelta(seconds=5)
    assert spec.failover.lease_duration_seconds == 60
    assert spec.failover.policy().release_volume is ReleaseVolume.WAIT_FOR_DETACH
    assert spec.worker.resources.lookup_threads() == 2  # 1.5 CPUs -> 2 threads
    assert dict(spec.worker.resources.requests) == {"cpu": "500m", "memory": "512Mi"}  # defaults


def test_external_release_and_schedule_timeout() -> None:
    spec = parse({**MINIMAL, "failover": {"releaseVolume": "External", "scheduleTimeout": "90s"}})
    policy = spec.failover.policy()
    assert policy.release_volume is ReleaseVolume.EXTERNAL
    assert policy.schedule_timeout == timedelta(seconds=90)
    assert parse(MINIMAL).failover.policy().schedule_timeout == timedelta(minutes=2)


@pytest.mark.parametrize(
    ("cpu", "threads"), [("500m", 1), ("1", 1), ("2", 2), ("2.5", 3), ("100", 64)]
)
def test_lookup_threads_follow_the_cpu_limit(cpu: str, threads: int) -> None:
    spec = parse({**MINIMAL, "worker": {"resources": {"limits": {"cpu": cpu}}}})
    assert spec.worker.resources.lookup_threads() == threads


@pytest.mark.parametrize(
    ("text", "value"), [("500m", 0.5), ("2", 2), ("1Gi", 2**30), ("1k", 1000), ("1e3", 1000)]
)
def test_quantities(text: str, value: float) -> None:
    assert quantity(text) == value


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"window": {}}, "window needs duration or maxKeys"),
        ({"window": {"duration": "1.5h"}}, "window.duration: not a duration"),
        ({"messageId": {"source": "header"}}, "messageId.field is required"),
        ({"storage": {"size": "lots"}}, "storage.size: 'lots' is not a quantity"),
        ({"failover": {"leaseDuration": "500ms"}}, "failover.leaseDuration must be at least 1s"),
        ({"partitions": None}, "spec of ns/events"),
        # the worker's rule (one owner, dedup_contract.ids.IdSpec), told in the spec's terms
        (
            {"messageId": {"source": "jsonField", "field": "meta..id"}},
            "messageId.field: JSON path 'meta..id' has an empty segment",
        ),
    ],
)
def test_spec_errors_are_readable(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse({**MINIMAL, **change})
