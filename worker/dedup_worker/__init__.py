"""The dedup worker: its share of the input (and internal) partitions -> RocksDB window ->
its output partition."""
