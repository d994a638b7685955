"""`dedupctl` entry point (inspection commands land with the operator issue)."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("dedupctl: no commands yet; see the project's issues.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
