"""The release this code is: one version for the Python package, the chart (`version`
and `appVersion`), the image's default tag and the CRD's default image.

The source is `pyproject.toml`'s `[project] version`, read here from the installed
package's metadata; tests/unit/project/test_release.py holds the chart, the operator's
default image, the CRD and CHANGELOG.md to it. CHANGELOG.md says, per release, what an
upgrade from the one before needs.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Final

DISTRIBUTION: Final = "dedup-operator"


def _installed() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree without installing it
        return "0+unknown"


VERSION: Final = _installed()
"""This code's release, e.g. "0.2.0"."""
