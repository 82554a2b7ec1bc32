"""The JSONL log of per-step training metrics (one :class:`~swarm.protocol.StepMetrics` per policy update).

The metrics themselves are defined once in :mod:`swarm.protocol` (``GET /api/v1/metrics`` serves them);
the run dir keeps them in ``metrics.jsonl`` (one JSON object per line, appended after each step).
"""

from __future__ import annotations

import json
from pathlib import Path

from swarm.protocol import StepMetrics, StepTimings

__all__ = ["MetricsLog", "StepMetrics", "StepTimings"]


class MetricsLog:
    """Append-only JSONL file of :class:`StepMetrics` (one object per line).

    Args:
        path: File to append to (parent directories are created).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def append(self, metrics: StepMetrics) -> None:
        """Append one step (flushed before returning)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(metrics.model_dump_json() + "\n")
            f.flush()

    def read(self) -> list[StepMetrics]:
        """All steps in file order; a torn last line (crash mid-write) is skipped."""
        if not self.path.exists():
            return []
        out: list[StepMetrics] = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                out.append(StepMetrics.model_validate(json.loads(line)))
            except (json.JSONDecodeError, ValueError):
                continue
        return out
