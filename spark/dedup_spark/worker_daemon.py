"""PySpark's Python worker daemon (`pyspark.daemon`), started with a shorter `sys.path`.

Spark puts `pyspark.zip`, the py4j zip and the spark-core jar on its Python workers'
PYTHONPATH (for installs where PySpark lives only there). Here PySpark is installed as
a package, so those entries only cost: every task of a reused worker calls
`importlib.invalidate_caches()`, after which each import lookup re-reads the zips' and
the 15 MB jar's directories. So the entries go from `sys.path` and their importers from
`sys.path_importer_cache` (Python made those at start-up, and `invalidate_caches` walks
that cache, not the path). Measured ~105 -> ~56 ms of overhead per Python task on
`local[2]` for the path alone, and a further ~15% of the Python workers' time in a 1M
record audit for the cache (bench/HISTORY.md, "Reconciliation audit"). Set as
`spark.python.daemon.module` by `dedup_spark.session`; when PySpark is not importable
without those entries, the path is left as it is.
"""

from __future__ import annotations

import os
import sys


def short_path(path: list[str]) -> list[str]:
    """`path` without the zip and jar entries, if PySpark is still importable from it."""
    kept = [p for p in path if not p.endswith((".zip", ".jar"))]
    if any(os.path.isfile(os.path.join(p or ".", "pyspark", "daemon.py")) for p in kept):
        return kept
    return path


def main() -> None:
    kept = short_path(sys.path)
    for entry in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(entry, None)
    sys.path[:] = kept
    from pyspark import daemon

    daemon.manager()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
