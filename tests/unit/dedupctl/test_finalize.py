"""dedupctl finalize-upgrade's pure part: when a pipeline may be finalized, and the guard
that refuses a rollback (the API server evaluates it in tests/integration/test_upgrade.py)."""

from __future__ import annotations

from typing import Any

from dedup_contract import names
from dedupctl import finalize


def body(operator: str | None = "0.2.0", ready: int = 3) -> dict[str, Any]:
    return {
        "spec": {"partitions": 3},
        "status": {"operatorVersion": operator, "readyPartitions": ready},
    }


def pod(name: str, made_by: str | None = "0.2.0") -> dict[str, Any]:
    annotations = {} if made_by is None else {names.ANNOTATION_OPERATOR_VERSION: made_by}
    return {"metadata": {"name": name, "annotations": annotations}}


def test_a_pipeline_all_on_the_release_may_be_finalized() -> None:
    assert finalize.blockers(body(), [pod("events-p0-e2"), pod("events-p1-e2")], "0.2.0") == []


def test_each_reason_not_to_finalize_is_named() -> None:
    found = finalize.blockers(
        body(operator="0.1.0", ready=2), [pod("events-p0-e1", made_by=None)], "0.2.0"
    )
    assert len(found) == 3
    assert "release 0.1.0, not 0.2.0 (helm upgrade first)" in found[0]
    assert "2 of 3 partitions are ready" in found[1]
    assert "worker pod events-p0-e1 was made by release before 0.2.0" in found[2]


def test_the_guard_denies_the_refused_releases_objects_only() -> None:
    policy = finalize.guard_policy(["0.1.0"], "0.2.0")
    selector = policy["spec"]["matchConstraints"]["objectSelector"]
    assert selector["matchLabels"] == {"app.kubernetes.io/part-of": "dedup-operator"}
    assert selector["matchExpressions"][0]["values"] == ["0.1.0"]
    (validation,) = policy["spec"]["validations"]
    assert "['0.1.0']" in validation["expression"]
    assert "StoreTooNew" in validation["message"] and "0.2.0" in validation["message"]
    binding = finalize.guard_binding()
    assert binding["spec"] == {"policyName": finalize.GUARD, "validationActions": ["Deny"]}
