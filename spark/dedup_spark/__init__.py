"""PySpark jobs: end-to-end reconciliation audit and batch backfill."""
