"""What a worker's exit code means: one table for the worker that exits with it and for
whoever reads it from a pod's `lastState.terminated.exitCode` (the runbooks, the tests).

0 stopped cleanly; 2 bad configuration; 3 fenced (the partition's Lease names another
holder or a newer epoch, its transactional id belongs to a newer worker, or the Lease
could not be taken at start); 4 stopped on input it may not drop; 5 the store refused;
6 Kafka unreachable or refusing.
"""

from __future__ import annotations

from typing import Final

EXIT_CONFIG: Final = 2
EXIT_FENCED: Final = 3
EXIT_STOPPED_ON_INPUT: Final = 4
EXIT_STORE: Final = 5
EXIT_KAFKA: Final = 6
