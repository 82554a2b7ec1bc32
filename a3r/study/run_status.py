"""How a run ended, in a3r's words and in the store's (``cancelled (budget)``).

Kept apart from the run types (`a3r.study.runs`, which load the analysis and SciPy) so ``a3r runs``
can word a run's status without loading the research layer.
"""

from __future__ import annotations

from typing import Literal

from memory import RunStatus

__all__ = ["STORE_STATUS", "RunStatusName", "status_text"]

RunStatusName = Literal["finished", "crashed", "hung", "budget", "failed_to_start", "needs_attention"]

STORE_STATUS: dict[str, RunStatus] = {
    "finished": RunStatus.finished,
    "needs_attention": RunStatus.cancelled,
    "budget": RunStatus.cancelled,
    "crashed": RunStatus.failed,
    "hung": RunStatus.failed,
    "failed_to_start": RunStatus.failed,
}
"""The store's status of a run by how it ended (the store knows only finished, failed, cancelled)."""


def status_text(name: RunStatusName) -> str:
    """How a run ended as the store and a3r both say it, e.g. ``cancelled (budget)``, so the report
    and ``a3r runs`` agree."""
    store = STORE_STATUS[name].value
    return store if store == name else f"{store} ({name})"
