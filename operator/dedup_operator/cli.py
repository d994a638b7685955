"""`dedup-operator` entry point (the reconciler lands with the operator issue)."""

import sys


def main(argv: list[str] | None = None) -> int:
    print(
        "dedup-operator: the operator is not implemented yet; "
        "see the project's issues. Nothing was started.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
