"""The runner's resume file: which episodes are done, so a restarted runner goes on where it stopped.

``<state_dir>/progress.jsonl`` gets one line per ended episode *after the server acknowledged its end*::

    {"kind": "train", "round": 0, "task_id": "7", "member": 1, "status": "finished",
     "reward": 1.0, "episode_id": "ep-…", "time": 1764490000.0}

``round`` is the epoch for train episodes and the eval round for eval episodes; ``member`` is the
episode's index in its GRPO group (0 … G-1). An episode slot ``(kind, round, task_id, member)`` is
*done* when its last line has status ``finished``, ``aborted`` (the agent failed: a real, scored
rollout) or ``partial_finish`` (a multi-model episode committed on some servers: retrying would
duplicate those). ``infra_failure`` lines are not done: a restart runs those slots again (and so do ``aborted`` ones
when the runner is started with ``rerun_aborted``, e.g. after fixing a bug in the workflow).

Semantics on restart (at-least-once per slot, never a lost finished episode):

- a slot whose end was written here is skipped;
- an episode open when the runner died is reclaimed by the server after its ``episode_timeout_s``
  (as an infrastructure failure, excluded from groups) and its slot runs again;
- an episode the server finished whose line was not yet written (a kill between the server's answer
  and the write, a window of microseconds) runs again: its group gets one extra episode;
- a torn last line (a kill in the middle of a write) is ignored.

Change the dataset order, group size or epochs and the slots mean something else: use a new state dir.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

DONE_STATUSES = frozenset({"finished", "aborted", "partial_finish"})
"""Statuses that end a slot for good (``infra_failure`` does not)."""

SlotKey = tuple[str, int, str, int]
"""``(kind, round, task_id, member)``."""


@dataclass(frozen=True)
class SlotRecord:
    """The last recorded end of one slot."""

    status: str
    reward: float | None
    episode_id: str | None


class ProgressLog:
    """Append-only JSONL of ended episodes, read back on start.

    Args:
        state_dir: folder of the resume file (created); ``None`` keeps progress in memory only.
    """

    FILE = "progress.jsonl"

    def __init__(self, state_dir: Path | None) -> None:
        self._slots: dict[SlotKey, SlotRecord] = {}
        self._fh: IO[str] | None = None
        self.path = state_dir / self.FILE if state_dir is not None else None
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            with self.path.open(encoding="utf-8") as fh:
                for line in fh:
                    self._load_line(line)
        self._fh = self.path.open("a", encoding="utf-8")

    def _load_line(self, line: str) -> None:
        try:
            row = json.loads(line)
            key: SlotKey = (str(row["kind"]), int(row["round"]), str(row["task_id"]), int(row["member"]))
            record = SlotRecord(str(row["status"]), row.get("reward"), row.get("episode_id"))
        except (ValueError, KeyError, TypeError):
            return  # a torn last line of a killed runner
        self._slots[key] = record

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def done(self, key: SlotKey, *, rerun_aborted: bool = False) -> bool:
        """Whether a slot has ended for good (``rerun_aborted``: agent failures count as not done)."""
        record = self._slots.get(key)
        if record is None or record.status not in DONE_STATUSES:
            return False
        return not (rerun_aborted and record.status == "aborted")

    def get(self, key: SlotKey) -> SlotRecord | None:
        return self._slots.get(key)

    def record(
        self,
        key: SlotKey,
        status: str,
        reward: float | None,
        episode_id: str | None,
        metrics: dict[str, float] | None = None,
    ) -> None:
        """Write the end of one slot (flushed to the OS at once, so a killed process keeps it), with the
        workflow's episode metrics (``Result.metrics``: the parts of its reward) when it reported any."""
        self._slots[key] = SlotRecord(status, reward, episode_id)
        if self._fh is None:
            return
        kind, round_, task_id, member = key
        row: dict[str, Any] = {
            "kind": kind,
            "round": round_,
            "task_id": task_id,
            "member": member,
            "status": status,
            "reward": reward,
            "episode_id": episode_id,
            "time": time.time(),
        }
        if metrics:
            row["metrics"] = metrics
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()
