"""`dedupctl finalize-upgrade`, its pure part: whether a pipeline may be finalized, and the
guard that refuses a rollback past a finalized upgrade.

Finalizing is the second phase of an upgrade (docs/operations.md, "Upgrading"): until
then the workers of a new release write the store format the previous release reads, so
a rollback keeps working. Finalizing sets `spec.upgrade.finalizedRelease`; the operator
rolls the workers with DEDUP_FINALIZED, and each marks its store format 3, which the
releases before (store_format.RELEASES_BEFORE_FINALIZED) cannot open.

A rollback past that point must be refused before an old worker meets such a store: the
old operator would not even know the StoreTooNew condition. The guard is a
ValidatingAdmissionPolicy (no webhook, evaluated by the API server itself) that denies
creating or updating any object of the chart labelled with one of those releases
(`app.kubernetes.io/part-of: dedup-operator`, `app.kubernetes.io/version`): `helm
rollback` or `kubectl apply` of an old install.yaml fails on its first object, and the
new release keeps running.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from dedup_contract import names

GUARD: Final = "dedup-operator-finalized"
"""The name of the ValidatingAdmissionPolicy and of its binding."""
VERSION_LABEL: Final = "app.kubernetes.io/version"


def blockers(
    pipeline: Mapping[str, Any], worker_pods: Sequence[Mapping[str, Any]], release: str
) -> list[str]:
    """Why the pipeline cannot be finalized to `release` yet (empty: it can): the operator
    that reconciles it and every worker pod must be of `release`, and every partition
    Ready (a rolling pipeline is finished first)."""
    status = pipeline.get("status") or {}
    spec = pipeline.get("spec") or {}
    out = []
    operator = status.get("operatorVersion")
    if operator != release:
        out.append(
            f"the operator that last reconciled it is release {operator or 'unknown'}, "
            f"not {release} (helm upgrade first)"
        )
    partitions = int(spec.get("partitions") or 0)
    ready = int(status.get("readyPartitions") or 0)
    if ready < partitions:
        out.append(f"{ready} of {partitions} partitions are ready (wait for the roll to end)")
    for pod in worker_pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        made_by = (meta.get("annotations") or {}).get(names.ANNOTATION_OPERATOR_VERSION)
        if made_by != release:
            out.append(
                f"worker pod {meta.get('name')} was made by release {made_by or 'before 0.2.0'}"
                f", not {release}"
            )
    return out


def guard_policy(refused: Sequence[str], release: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy that denies the chart's objects of the `refused`
    releases (those that cannot open the stores `release` writes once finalized)."""
    listed = ", ".join(refused)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": GUARD, "labels": {names.LABEL_PART_OF: "dedup-operator"}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["*"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["*"],
                    }
                ],
                "objectSelector": {
                    "matchLabels": {names.LABEL_PART_OF: "dedup-operator"},
                    "matchExpressions": [
                        {"key": VERSION_LABEL, "operator": "In", "values": list(refused)}
                    ],
                },
            },
            "validations": [
                {
                    # the new object only: an update away from a refused release passes
                    "expression": (
                        f"!has(object.metadata.labels) || !('{VERSION_LABEL}' in "
                        f"object.metadata.labels) || !(object.metadata.labels['{VERSION_LABEL}'] "
                        f"in {list(refused)!r})"
                    ),
                    "message": (
                        f"dedup-operator: an upgrade to {release} was finalized (dedupctl "
                        f"finalize-upgrade): the stores are written in a format that release "
                        f"{listed} cannot open (StoreTooNew); a rollback to it is refused. "
                        f"Stay on {release} or a later release (docs/operations.md, Upgrading)"
                    ),
                    "reason": "Forbidden",
                }
            ],
        },
    }


def guard_binding() -> dict[str, Any]:
    """The binding that makes the guard deny (cluster-wide)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": GUARD, "labels": {names.LABEL_PART_OF: "dedup-operator"}},
        "spec": {"policyName": GUARD, "validationActions": ["Deny"]},
    }
