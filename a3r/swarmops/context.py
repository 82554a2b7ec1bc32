"""What executing a run needs from its caller (`ExecutionContext`), declared here so that the run
executor depends on no layer above it.

The research graph's `a3r.graph.context.RunContext` satisfies it structurally; the executor reads the
knowledge store, the limits and the live servers through it and never imports the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from a3r.study.sequential import SignalRule
from a3r.swarmops.processes import ServerHandle
from memory import Store

__all__ = ["ExecutionContext", "OnceLedger"]


class OnceLedger(Protocol):
    """An idempotency ledger: ``once(key, create)`` creates a value the first time a key is seen and
    returns the recorded one afterwards."""

    def once(self, key: str, create: Callable[[], Any]) -> Any:
        """``create()`` the first time ``key`` is seen, the recorded result afterwards."""
        ...


class ExecutionContext(Protocol):
    """The store, limits and live servers one run executes with (read-only attributes).

    Attributes:
        store: The knowledge store (metric points and events of the run are written there).
        ledger: Idempotency ledger (attach base step, held-out task count).
        model: ``swarm serve --model`` (``None``: the embedded model).
        server_url: Attach to this server instead of starting one.
        admin_token: Admin token of the attached server (secret; memory only).
        hang_after_s: Seconds without progress after which a run is hung.
        poll_s: Seconds between polls of a running server.
        eval_tasks: Held-out tasks evaluated per run.
        eval_samples: Attempts per held-out task.
        preflight_samples: Attempts per held-out task in the preflight.
        episode_timeout_s: Per-episode time limit of evaluation clients.
        preflight_budget_s: Wall seconds a research preflight run may take, server start included
            (0: no budget); its held-out attempts are cut when it runs out and count as no success.
        signal: When a preflight stops for lack of signal (`a3r.study.sequential`).
        server_options: Extra ``swarm serve`` options for every started server.
        servers: Live servers by server key (the executor adds and removes entries).
    """

    @property
    def store(self) -> Store: ...
    @property
    def ledger(self) -> OnceLedger: ...
    @property
    def model(self) -> str | None: ...
    @property
    def server_url(self) -> str | None: ...
    @property
    def admin_token(self) -> str | None: ...
    @property
    def hang_after_s(self) -> float: ...
    @property
    def poll_s(self) -> float: ...
    @property
    def eval_tasks(self) -> int: ...
    @property
    def eval_samples(self) -> int: ...
    @property
    def preflight_samples(self) -> int: ...
    @property
    def episode_timeout_s(self) -> float: ...
    @property
    def preflight_budget_s(self) -> float: ...
    @property
    def signal(self) -> SignalRule: ...
    @property
    def server_options(self) -> dict[str, Any]: ...
    @property
    def servers(self) -> dict[str, ServerHandle]: ...

    def say(self, line: str) -> None:
        """Report progress (one line)."""
        ...

    def key(self, node: str, step: str) -> str:
        """Idempotency key of a side effect (thread id + node + step)."""
        ...
