"""Writes the fuzz outcome counts (:data:`fuzz_support.OUTCOMES`) to ``$DPFY_FUZZ_STATS``."""

from __future__ import annotations

import collections
import json
import os

from fuzz.fuzz_support import OUTCOMES


def pytest_sessionfinish(session, exitstatus) -> None:
    """Dump the per-suite outcome counts when DPFY_FUZZ_STATS names a file."""
    path = os.environ.get("DPFY_FUZZ_STATS")
    if path and OUTCOMES:
        rows = collections.defaultdict(dict)
        for (suite, outcome), n in sorted(OUTCOMES.items()):
            rows[suite][outcome] = n
        with open(path, "w") as f:
            json.dump(rows, f, indent=2)
