"""The server's per-step metrics rows: ``metrics.jsonl`` in the run dir and ``GET /api/v1/metrics``.

A row (`ServerStepMetrics`) is the trainer's `StepMetrics` plus what the server knows of the step's
batch: the policy, groups, dropped episodes, merge statistics, the drain before it, staleness, the
checkpoint's time, and, on the first row after a restart, the steps whose update was lost
(docs/ARCHITECTURE.md §Crash safety).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from swarm.protocol import ServerStepMetrics, StepMetrics
from swarm.server.step_batch import StepBatch

__all__ = ["Drain", "StepHistory", "read_rows"]


@dataclass(frozen=True)
class Drain:
    """What happened to open episodes before a step (reported in its metrics)."""

    seconds: float = 0.0
    """Spent draining (synchronous)."""
    aborted: int = 0
    """Aborted at the drain timeout (synchronous)."""
    stale_aborted: int = 0
    """Aborted as too stale when the step started (asynchronous)."""


def read_rows(path: Path) -> list[ServerStepMetrics]:
    """The rows of a ``metrics.jsonl`` file, oldest first (none when it does not exist); a torn last line
    (a crash mid-write) is skipped. Reads only: a retired tenant's rows are served from its file."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(ServerStepMetrics.model_validate_json(line))
        except ValueError:
            continue  # a torn last line from a crash
    return rows


class StepHistory:
    """The rows of ``path`` (``metrics.jsonl``), oldest first.

    Args:
        path: the JSONL file (one row per line, appended after each step).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[ServerStepMetrics] = []
        self.rewound_steps: list[int] = []
        """Steps whose update died with the previous process; the next row carries them."""

    def resume(self, step: int) -> set[int]:
        """Keep the rows up to ``step`` (the restored checkpoint), in memory and in the file; returns
        the steps of the rows dropped. A torn last line (a crash mid-write) is dropped silently."""
        rows = read_rows(self.path)
        kept = [row for row in rows if row.step <= step]
        if self.path.exists():
            self.path.write_text("".join(m.model_dump_json() + "\n" for m in kept))
        self.rows = kept
        return {row.step for row in rows if row.step > step}

    def record(
        self, base: StepMetrics, step_batch: StepBatch, *, policy: str, drain: Drain, checkpoint_s: float
    ) -> ServerStepMetrics:
        """The step's row, appended to the file and the rows (it carries the rewound steps, once)."""
        batch, staleness = step_batch.batch, step_batch.staleness
        row = ServerStepMetrics(
            **base.model_dump(),
            batch_policy=policy,
            groups=len(batch.groups),
            episodes_dropped=len(batch.dropped),
            merge=step_batch.merge,
            drain_s=drain.seconds,
            drain_aborted=drain.aborted,
            stale_aborted=drain.stale_aborted,
            staleness_mean=sum(staleness) / len(staleness) if staleness else 0.0,
            staleness_max=max(staleness, default=0),
            checkpoint_s=checkpoint_s,
            rewound_steps=self.rewound_steps,
            distill=step_batch.distill,
        )
        self.rewound_steps = []
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(row.model_dump_json() + "\n")
        self.rows.append(row)
        return row
