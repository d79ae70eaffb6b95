"""Put tests/ on the path, so every test directory can import the shared oracles
(``oracles.py``: the float64 per-example loop; ``ledger_events.py``: ε by dp_accounting)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
