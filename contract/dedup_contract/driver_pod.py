"""A Spark driver pod's identity, as the operator renders it and the job reads it.

The audit's CronJob (rendered by the operator) runs its driver in client mode in its own
pod; the job (`dedup_spark.session`) names itself to Spark from these environment
variables, which the pod gets from the downward API.
"""

from __future__ import annotations

from typing import Final

POD_FIELDS: Final = {
    "DEDUP_POD_IP": "status.podIP",
    "DEDUP_POD_NAME": "metadata.name",
    "DEDUP_NAMESPACE": "metadata.namespace",
}
"""A driver pod's identity: env name -> the downward-API field that sets it."""


def pod_identity_env() -> list[dict[str, object]]:
    """The env entries (fieldRefs) a driver pod's container carries."""
    return [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in POD_FIELDS.items()
    ]
