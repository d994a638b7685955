"""The rules the parts share, at the bottom of the import graph.

The worker (dedup_worker), the operator (dedup_operator), the Spark jobs (dedup_spark)
and dedupctl each import this package and never each other: whatever two of them must
agree on lives here, once. Id rules (`ids`), the window (`window`), the Lease clock and the holder's
timing (`lease_clock`), object names (`names`), test fault points (`faults`), the worker's
exit codes (`exit_codes`), the owner of an id (`ownership`), batch rules (`batch`), the
store's on-disk format (`store_format`) and the store on RocksDB (`store`), the log
format (`logs`), librdkafka's log levels (`broker_logs`), Kafka `key=value` settings
(`kafka_settings`), Kubernetes time formats (`timefmt`), the API-client builder
(`kube_client`), a Spark driver pod's identity (`driver_pod`), how a handover is recorded
and told (`handover`), what status says of ownership (`ownership_status`) and the
worker's metric names and their scrape (`worker_metrics`).

It imports nothing of ours (only the standard library and third-party packages);
tests/unit/project/test_import_layers.py holds every part to that.
"""
