"""The dedup worker: one Kafka input partition -> RocksDB window -> one output partition."""
