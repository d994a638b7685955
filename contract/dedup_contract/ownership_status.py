"""What a pipeline's status says of ownership: written by the operator, read by dedupctl.

The operator records which ownership generation a pipeline's workers run under
`status.ownership` (`dedup_operator.ownership_generation` decides it) and says a switch
to ownership in progress with the condition `OwnershipSwitching`; a pipeline whose
status shows workers started and no record ran before ownership existed. dedupctl reads
the same to tell where a pipeline stands (`dedupctl switch-ownership`). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

STATUS_KEY: Final = "ownership"
OWNERSHIP_SWITCHING: Final = "OwnershipSwitching"


def ran_before(previous: Mapping[str, Any]) -> bool:
    """Whether the status shows workers started: some partition had a pod (epoch >= 1)."""
    for entry in previous.get("partitions") or []:
        if int(entry.get("epoch") or 0) > 0 or entry.get("pod"):
            return True
    return False
