"""`dedupctl` (and `kubectl dedup`): the user's view of a pipeline's health, handovers
and audits, and the switch to ownership.

`cli` is the shell (argument parsing, the Kubernetes API, the workers' /metrics through
the API server's pod proxy); `view` is pure and builds what is shown from what the
cluster holds. It reads what the operator writes and the worker exports through the
rules they share, `dedup_contract`, and never imports the operator:
tests/unit/project/test_import_layers.py holds it to that.
"""
