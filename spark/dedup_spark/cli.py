"""`dedup-reconcile` entry point (the audit job lands with the Spark issue)."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("dedup-reconcile: the reconciliation job is not implemented yet.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
