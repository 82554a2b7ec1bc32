"""The bench scripts import their siblings as top-level modules (as ``python bench/x.py`` runs them), so
their folder goes on ``sys.path`` for these tests."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
