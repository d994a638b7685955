"""The chart's RBAC as a table: every verb on every resource the operator is granted,
with the code that needs it, and what it must be denied. tests/integration/test_chart.py
checks the rendered Roles equal these rows; test_chart_cluster.py asks the real API
server (`kubectl auth can-i --as=system:serviceaccount:...`) for each of them.

"granted on" marks verbs the operator never calls itself but puts in the worker Role
(desired/pipeline.py) or the audit Role (desired/scheduled_audit.py): the API server
refuses to create a Role, or a RoleBinding to it, with permissions its creator does not
hold (escalation prevention), and the operator holds no `escalate` or `bind`.
"""

from __future__ import annotations

from typing import Final

# (apiGroup, resource, verbs, why) in each watched namespace
NAMESPACED: Final = (
    ("dedup.io", "deduppipelines", ("get", "list", "watch", "patch"),
     "kopf watches and patches (finalizer, progress annotations); reconcile reads; "
     "cli preflight lists"),
    ("dedup.io", "deduppipelines/status", ("patch",), "kube.patch_status"),
    ("", "events", ("create",), "kube.event: the pipeline's Events"),
    ("", "pods", ("get", "list", "watch", "create", "delete", "deletecollection", "patch"),
     "worker pods: create_pod, pods (watched: cache.py), delete_pod; get/patch/deletecollection "
     "granted on (audit Role: the Spark driver manages its executors)"),
    ("", "persistentvolumeclaims", ("get", "list", "watch", "create", "patch"),
     "ensure, volume_claims (watched: cache.py), resize_volume_claim, release_volume_claims"),
    ("", "services", ("get", "create", "delete", "deletecollection"),
     "the workers' headless Service; delete/deletecollection granted on (audit Role)"),
    ("", "serviceaccounts", ("get", "create", "delete"),
     "worker and audit ServiceAccounts; the audit's deleted with spec.reconciliation"),
    ("", "configmaps",
     ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"),
     "config_map, add_owner_reference (the audit result); the rest granted on (audit Role)"),
    ("", "secrets", ("get",), "secret_value: kafka.securityRef for the input-topic check"),
    ("coordination.k8s.io", "leases", ("get", "list", "watch", "create", "update", "patch"),
     "partition Leases: ensure, leases (watched: cache.py); update/patch granted on (worker Role)"),
    ("policy", "poddisruptionbudgets", ("get", "create", "patch"),
     "the workers' PodDisruptionBudget: ensure, replace_disruption_budget_spec"),
    ("rbac.authorization.k8s.io", "roles", ("get", "create", "patch", "delete"),
     "worker and audit Roles: ensure, replace_role_rules, delete_if_present"),
    ("rbac.authorization.k8s.io", "rolebindings", ("get", "create", "delete"),
     "worker and audit RoleBindings"),
    ("batch", "cronjobs", ("get", "create", "update", "delete"),
     "the scheduled audit without the Spark operator (apply_by_hash, delete_if_present)"),
    ("sparkoperator.k8s.io", "scheduledsparkapplications", ("get", "create", "update", "delete"),
     "the scheduled audit under the Spark operator"),
    ("sparkoperator.k8s.io", "sparkapplications", ("list",),
     "spark_applications: the state of the newest audit run"),
)  # fmt: skip

SPARK_CRD: Final = "scheduledsparkapplications.sparkoperator.k8s.io"
PIPELINE_CRD: Final = "deduppipelines.dedup.io"

# (apiGroup, resource, resourceName, verbs, why), cluster-scoped, in both scopes
CLUSTER: Final = (
    ("", "nodes", "", ("get", "list", "watch", "patch"),
     "nodes (observe: watched, cache.py), taint_out_of_service / remove_out_of_service (read, then a "
     "compare-and-set patch)"),
    ("storage.k8s.io", "volumeattachments", "", ("list", "watch"),
     "volume_attachments (watched): no replacement while the old volume is attached"),
    ("apiextensions.k8s.io", "customresourcedefinitions", SPARK_CRD, ("get",),
     "has_crd: ScheduledSparkApplication or CronJob"),
    ("apiextensions.k8s.io", "customresourcedefinitions", PIPELINE_CRD, ("get",),
     "storage_version: the CRD's storedVersions"),
    ("apiextensions.k8s.io", "customresourcedefinitions/status", PIPELINE_CRD, ("patch",),
     "storage_version: storedVersions pruned once every pipeline is stored at v1beta1"),
)  # fmt: skip

# with rbac.scope namespaced and rbac.listPodsOnNodes (the default), in the ClusterRole
POD_LIST: Final = (
    "", "pods", "", ("list",),
    "kube.pods_on_node: the out-of-service taint only when every pod on the lost node "
    "(any namespace) is a fenced dedup worker",
)  # fmt: skip

NAMESPACED_ROWS: Final = frozenset(
    (group, resource, "", verb) for group, resource, verbs, _ in NAMESPACED for verb in verbs
)
CLUSTER_ROWS: Final = frozenset(
    (group, resource, name, verb) for group, resource, name, verbs, _ in CLUSTER for verb in verbs
)
POD_LIST_ROWS: Final = frozenset({("", "pods", "", "list")})

# (verb, resource as kubectl names it, subresource or ""): never, in any namespace
DENIED_EVERYWHERE: Final = (
    ("create", "pods", "exec"),
    ("get", "pods", "log"),
    ("list", "secrets", ""),
    ("watch", "secrets", ""),
    ("create", "secrets", ""),
    ("update", "secrets", ""),
    ("escalate", "roles.rbac.authorization.k8s.io", ""),
    ("bind", "roles.rbac.authorization.k8s.io", ""),
    ("escalate", "clusterroles.rbac.authorization.k8s.io", ""),
    ("bind", "clusterroles.rbac.authorization.k8s.io", ""),
    ("create", "clusterroles.rbac.authorization.k8s.io", ""),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", ""),
    ("impersonate", "serviceaccounts", ""),
    ("create", "serviceaccounts", "token"),
    ("delete", "nodes", ""),
    ("update", "deduppipelines.dedup.io", ""),
    ("delete", "deduppipelines.dedup.io", ""),
    ("delete", "persistentvolumeclaims", ""),
    ("delete", "volumeattachments.storage.k8s.io", ""),
    ("list", "customresourcedefinitions.apiextensions.k8s.io", ""),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io/deduppipelines.dedup.io", ""),
    ("update", "customresourcedefinitions.apiextensions.k8s.io/deduppipelines.dedup.io", ""),
    ("list", "namespaces", ""),
    ("create", "deployments.apps", ""),
)
