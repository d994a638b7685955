"""The pipeline's workloads and the objects beside them: `ensure` (create unless
present) of its ServiceAccount, Role, RoleBinding, Service, PodDisruptionBudget, volume
claims, Leases and pods, their updates, the worker pods read and deleted; the scheduled
audit's CronJob or ScheduledSparkApplication kept in step by spec hash, its ConfigMap
and SparkApplications; secrets read."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dedup_contract import names
from dedup_operator.desired.scheduled_audit import (
    SCHEDULED_APP_LABEL,
    SCHEDULED_SPARK_APPLICATIONS,
    SPARK_APPLICATIONS,
    SPARK_OPERATOR_GROUP,
    SPARK_OPERATOR_VERSION,
)
from dedup_operator.kube_calls import KubeCalls, Obj, absent, log

# The kinds a pass reads from a pipeline watch, by the kind `ensure` creates.
WRITTEN_THROUGH = {"PersistentVolumeClaim": "volumeclaims", "Lease": "leases"}


class KubeWorkloads(KubeCalls):
    """Create, update, read and delete the pipeline's workloads and its audit's objects."""

    _crds: dict[str, tuple[float, bool]]  # name -> (monotonic time, found)

    def ensure(self, body: Mapping[str, Any]) -> bool:
        """Create `body` unless an object of that name exists; True if created. Kinds
        the operator keeps in step with the spec are updated by their own methods."""
        self._may_act(f"create {body['kind']} {body['metadata']['name']}")
        kind, ns, name = body["kind"], body["metadata"]["namespace"], body["metadata"]["name"]
        create, read = self._create_read(kind)
        trusted, held = (
            self._held(WRITTEN_THROUGH[kind], ns, name)
            if kind in WRITTEN_THROUGH
            else (False, None)
        )
        if held is not None:
            return False
        try:
            if not trusted:  # a watched kind the watch says is absent: no read
                read(name, ns)
                return False
        except ApiException as exc:
            if not absent(exc):
                raise
        try:
            created = create(ns, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return False
        if kind in WRITTEN_THROUGH:
            self._wrote(WRITTEN_THROUGH[kind], created)
        log.info("created %s %s/%s", kind, ns, name)
        return True

    def _create_read(self, kind: str) -> tuple[Any, Any]:
        rbac = client.RbacAuthorizationV1Api(self.api)
        policy = client.PolicyV1Api(self.api)
        table = {
            "ServiceAccount": (
                self.core.create_namespaced_service_account,
                self.core.read_namespaced_service_account,
            ),
            "Role": (rbac.create_namespaced_role, rbac.read_namespaced_role),
            "RoleBinding": (rbac.create_namespaced_role_binding, rbac.read_namespaced_role_binding),
            "Service": (self.core.create_namespaced_service, self.core.read_namespaced_service),
            "PodDisruptionBudget": (
                policy.create_namespaced_pod_disruption_budget,
                policy.read_namespaced_pod_disruption_budget,
            ),
            "PersistentVolumeClaim": (
                self.core.create_namespaced_persistent_volume_claim,
                self.core.read_namespaced_persistent_volume_claim,
            ),
            "Lease": (
                self.coordination.create_namespaced_lease,
                self.coordination.read_namespaced_lease,
            ),
            "Pod": (self.core.create_namespaced_pod, self.core.read_namespaced_pod),
        }
        return table[kind]

    def replace_role_rules(self, body: Mapping[str, Any]) -> None:
        self._may_act("update the Role")
        rbac = client.RbacAuthorizationV1Api(self.api)
        meta = body["metadata"]
        rbac.patch_namespaced_role(meta["name"], meta["namespace"], {"rules": body["rules"]})

    def replace_disruption_budget_spec(self, body: Mapping[str, Any]) -> None:
        """Keep the workers' PodDisruptionBudget in step with the spec (its minAvailable
        follows spec.partitions; budgets made before it was a number are corrected)."""
        self._may_act("update the PodDisruptionBudget")
        meta = body["metadata"]
        client.PolicyV1Api(self.api).patch_namespaced_pod_disruption_budget(
            meta["name"], meta["namespace"], {"spec": body["spec"]}
        )

    def create_pod(self, body: Mapping[str, Any]) -> bool:
        self._may_act(f"create pod {body['metadata']['name']}")
        meta = body["metadata"]
        try:
            created = self._raw(self.core.create_namespaced_pod, meta["namespace"], body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        self._wrote("pods", created)
        log.info("created pod %s/%s", meta["namespace"], meta["name"])
        return True

    def pods(self, namespace: str, pipeline: str) -> list[Obj]:
        cached = self._pipeline_objects("pods", namespace, pipeline)
        if cached is not None:
            return list(cached.values())
        selector = (
            f"{names.LABEL_PIPELINE}={pipeline},{names.LABEL_COMPONENT}={names.COMPONENT_WORKER}"
        )
        found = self.core.list_namespaced_pod(namespace, label_selector=selector)
        return [self._json(p) for p in found.items]

    def delete_pod(self, namespace: str, name: str, force: bool, uid: str | None = None) -> bool:
        """Delete the pod the pass observed: only that incarnation (`uid`, a precondition
        the API server checks), never a successor of the same name created since.
        False when it is gone or is another pod now (409)."""
        self._may_act(f"delete pod {name}")
        body = client.V1DeleteOptions(
            grace_period_seconds=0 if force else None,
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
        )
        try:
            self.core.delete_namespaced_pod(
                name,
                namespace,
                body=body,
                grace_period_seconds=0 if force else None,
                _preload_content=False,  # the answer is not read
            )
        except ApiException as exc:
            if absent(exc) or exc.status == 409:
                return False
            raise
        return True

    # ---------------------------------------------------------- scheduled audit
    def has_crd(self, name: str, max_age_s: float = 60.0) -> bool:
        """Is the CustomResourceDefinition `name` installed? (remembered for max_age_s)"""
        now = time.monotonic()
        cached = self._crds.get(name)
        if cached is not None and now - cached[0] < max_age_s:
            return cached[1]
        try:
            client.ApiextensionsV1Api(self.api).read_custom_resource_definition(name)
            found = True
        except ApiException as exc:
            if not absent(exc):
                raise
            found = False
        self._crds[name] = (now, found)
        return found

    def _scheduler_calls(self, kind: str) -> tuple[Any, Any, Any, Any]:
        """(read, create, replace, delete) of a kind the operator keeps in step by its
        spec-hash annotation, each called as (namespace, name[, body])."""
        if kind == "CronJob":
            batch = client.BatchV1Api(self.api)
            return (
                lambda ns, n: self._json(batch.read_namespaced_cron_job(n, ns)),
                lambda ns, b: batch.create_namespaced_cron_job(ns, b),
                lambda ns, n, b: batch.replace_namespaced_cron_job(n, ns, b),
                lambda ns, n: batch.delete_namespaced_cron_job(
                    n, ns, propagation_policy="Background"
                ),
            )
        if kind == "ScheduledSparkApplication":
            g, v, plural = (
                SPARK_OPERATOR_GROUP,
                SPARK_OPERATOR_VERSION,
                SCHEDULED_SPARK_APPLICATIONS,
            )
            custom = self.custom
            return (
                lambda ns, n: custom.get_namespaced_custom_object(g, v, ns, plural, n),
                lambda ns, b: custom.create_namespaced_custom_object(g, v, ns, plural, b),
                lambda ns, n, b: custom.replace_namespaced_custom_object(g, v, ns, plural, n, b),
                lambda ns, n: custom.delete_namespaced_custom_object(g, v, ns, plural, n),
            )
        rbac = client.RbacAuthorizationV1Api(self.api)
        deletes = {
            "ServiceAccount": self.core.delete_namespaced_service_account,
            "Role": rbac.delete_namespaced_role,
            "RoleBinding": rbac.delete_namespaced_role_binding,
        }
        return (None, None, None, lambda ns, n: deletes[kind](n, ns))

    def apply_by_hash(self, body: Mapping[str, Any]) -> str:
        """Create `body` (a CronJob or ScheduledSparkApplication), or replace it when its
        `dedup.io/spec-hash` annotation differs; returns created|updated|unchanged."""
        self._may_act(f"apply {body['kind']}")
        kind, meta = body["kind"], body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        read, create, replace, _ = self._scheduler_calls(kind)
        try:
            current = read(ns, name)
        except ApiException as exc:
            if not absent(exc):
                raise
            create(ns, dict(body))
            log.info("created %s %s/%s", kind, ns, name)
            return "created"
        want = (meta.get("annotations") or {}).get(names.ANNOTATION_SPEC_HASH)
        have = ((current.get("metadata") or {}).get("annotations") or {}).get(
            names.ANNOTATION_SPEC_HASH
        )
        if want == have:
            return "unchanged"
        updated = {
            **body,
            "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]},
        }
        replace(ns, name, updated)
        log.info("updated %s %s/%s", kind, ns, name)
        return "updated"

    def delete_if_present(self, kind: str, namespace: str, name: str) -> bool:
        """Delete a scheduled-audit object; False if it (or its kind) is not there."""
        self._may_act(f"delete {kind} {name}")
        delete = self._scheduler_calls(kind)[3]
        try:
            delete(namespace, name)
        except ApiException as exc:
            if absent(exc):
                return False
            raise
        log.info("deleted %s %s/%s", kind, namespace, name)
        return True

    def config_map(self, namespace: str, name: str) -> Obj | None:
        try:
            return self._json(self.core.read_namespaced_config_map(name, namespace))
        except ApiException as exc:
            if absent(exc):
                return None
            raise

    def add_owner_reference(
        self, namespace: str, config_map: Mapping[str, Any], reference: Mapping[str, Any]
    ) -> None:
        """Give a ConfigMap (as read) the pipeline's owner reference; compare-and-set."""
        self._may_act("add an owner reference")
        meta = config_map["metadata"]
        refs = list(meta.get("ownerReferences") or [])
        if any(r.get("uid") == reference["uid"] for r in refs):
            return
        try:
            self.core.patch_namespaced_config_map(
                meta["name"],
                namespace,
                {
                    "metadata": {
                        "resourceVersion": meta["resourceVersion"],
                        "ownerReferences": [*refs, dict(reference)],
                    }
                },
            )
        except ApiException as exc:
            if exc.status not in (404, 409):  # replaced or gone meanwhile: next pass
                raise

    def spark_applications(self, namespace: str, scheduled: str) -> list[Obj]:
        """The SparkApplications the Spark operator started for ScheduledSparkApplication
        `scheduled` (its scheduled-app-name label)."""
        try:
            found: Any = self.custom.list_namespaced_custom_object(
                SPARK_OPERATOR_GROUP,
                SPARK_OPERATOR_VERSION,
                namespace,
                SPARK_APPLICATIONS,
                label_selector=f"{SCHEDULED_APP_LABEL}={scheduled}",
            )
        except ApiException as exc:
            if absent(exc):
                return []
            raise
        return list(found.get("items") or [])

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        import base64

        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if absent(exc):
                return None
            raise
        raw = (secret.data or {}).get(key)
        return base64.b64decode(raw).decode() if raw is not None else None
