"""Desired state as pure functions: a `PipelineSpec` (+ what was observed, such as a
partition's epoch) -> the API objects the operator creates, as JSON-ready dicts.

- `owner`: the owner reference and metadata every object carries;
- `partition`: per partition the PVC, the Lease and the worker Pod (+ its template hash);
- `pipeline`: per pipeline the workers' ServiceAccount/Role/RoleBinding, the headless
  metrics Service and the PodDisruptionBudget;
- `scheduled_audit`: the scheduled audit (`spec.reconciliation`): its CronJob or
  ScheduledSparkApplication and the driver's RBAC.
"""
