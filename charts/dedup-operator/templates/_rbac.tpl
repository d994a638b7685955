{{/*
What the operator calls, derived from operator/dedup_operator/*.py (the RBAC table of
docs/operations.md#rbac and tests/support/chart_rbac.py list the same rows). Verbs marked
"granted on" are ones the operator does not call itself but grants in the Roles it
creates: Kubernetes refuses to create a Role or RoleBinding with permissions its
creator does not hold (escalation prevention), and the operator holds no escalate/bind.
*/}}

{{/* Rules in each watched namespace (a Role there, or the ClusterRole with -A). */}}
{{- define "dedup-operator.namespacedRules" -}}
# kopf watches and patches (finalizer, annotations); reconcile reads; preflight lists
- apiGroups: [dedup.io]
  resources: [deduppipelines]
  verbs: [get, list, watch, patch]
# kube.patch_status
- apiGroups: [dedup.io]
  resources: [deduppipelines/status]
  verbs: [patch]
# kube.event: the pipeline's Events
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# worker pods: create, list and watch (cache.py), delete (force on failover);
# get/patch/deletecollection are granted on in the audit Role (the Spark driver manages
# its executor pods)
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, deletecollection, patch]
# the partitions' volumes: ensure, list and watch (cache.py), resize, drop the owner
# reference (retainOnDelete)
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch, create, patch]
# the workers' headless metrics Service; delete/deletecollection granted on (audit Role)
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, delete, deletecollection]
# the workers' and the audit's ServiceAccounts (the audit's deleted with its spec)
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create, delete]
# the audit result ConfigMap: read, add the owner reference; the rest granted on (audit Role)
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update, patch, delete, deletecollection]
# kafka.securityRef: the Kafka client settings for the input-topic check (get only)
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
# the partitions' Leases: ensure, list and watch (cache.py); update/patch granted on
# (worker Role)
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update, patch]
# the workers' PodDisruptionBudget: ensure, keep its minAvailable in step (patch)
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch]
# the worker and audit Roles: ensure, keep their rules in step (patch), delete the audit's
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles]
  verbs: [get, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [rolebindings]
  verbs: [get, create, delete]
# the scheduled audit without the Spark operator
- apiGroups: [batch]
  resources: [cronjobs]
  verbs: [get, create, update, delete]
# the scheduled audit under the Spark operator, and its runs' state
- apiGroups: [sparkoperator.k8s.io]
  resources: [scheduledsparkapplications]
  verbs: [get, create, update, delete]
- apiGroups: [sparkoperator.k8s.io]
  resources: [sparkapplications]
  verbs: [list]
{{- end }}

{{/* Cluster-scoped things, needed in either scope. */}}
{{- define "dedup-operator.clusterRules" -}}
# observe: the nodes, followed by a watch (cache.py; a list while it is not synced);
# failover taints a lost node out-of-service and lifts its own taint (read, then a
# compare-and-set patch)
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch, patch]
# observe: never start a replacement while the old volume is attached (watched)
- apiGroups: [storage.k8s.io]
  resources: [volumeattachments]
  verbs: [list, watch]
# kube.has_crd: is the Spark operator installed (ScheduledSparkApplication or CronJob)
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  resourceNames: [scheduledsparkapplications.sparkoperator.k8s.io]
  verbs: [get]
# storage_version: the DedupPipeline CRD's storedVersions (read), pruned to the storage
# version once every pipeline was rewritten at it (the status only, never the CRD)
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  resourceNames: [deduppipelines.dedup.io]
  verbs: [get]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions/status]
  resourceNames: [deduppipelines.dedup.io]
  verbs: [patch]
{{- if and .Values.rbac.listPodsOnNodes (ne .Values.rbac.scope "cluster") }}
# kube.pods_on_node: before tainting a lost node out-of-service, every pod bound to it
# (any namespace) must be a fenced dedup worker (the namespaced rules have it with -A)
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
{{- end }}
{{- end }}
