"""The run context of the research graph (LangGraph runtime context) and its idempotency ledger.

`RunContext` carries what nodes use but the state must not hold: the knowledge store, the LLM
provider, live swarm server handles, the admin token of an attached server, budgets and callbacks.
`Ledger` makes side effects idempotent across node re-runs (a node re-runs from its start when the
graph resumes after an interrupt or a crash): ``ledger.once(key, create)`` returns the recorded result
for a key (thread id + node + step) instead of creating again.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from a3r.providers import ResearchProvider
from a3r.study.design import PREFLIGHT_BUDGET_S
from a3r.study.price import SEQUENTIAL, Serving
from a3r.study.research import WRAP_UP_S, spent_s
from a3r.study.runs import RunOutcome, RunSpec
from a3r.study.sequential import SignalRule
from a3r.swarmops.context import ExecutionContext
from a3r.swarmops.execution import Workspace, execute_run
from a3r.swarmops.processes import ServerHandle
from a3r.swarmops.tenancy import TenantSettings, stage_pricing
from memory import Store

__all__ = ["Ledger", "RunContext", "RunExecutor"]


class RunExecutor(Protocol):
    """What the runner node calls to execute one run: the seam between the research graph and the
    runs. `a3r.swarmops.execution.execute_run` starts swarm servers and clients; ``bench/research.py``
    answers from a simulated landscape of learning curves behind the same call."""

    def __call__(
        self,
        spec: RunSpec,
        *,
        ctx: ExecutionContext,
        ws: Workspace,
        run_id: int,
        budget_s: float,
        eval_reserve_s: float,
    ) -> RunOutcome:
        """Execute ``spec`` within ``budget_s`` seconds, keeping ``eval_reserve_s`` for its held-out
        evaluation, and return what it produced."""
        ...


class Ledger:
    """A key → JSON value table in a SQLite file (the checkpoint database by default).

    Args:
        path: SQLite file.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS a3r_ledger (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
        )
        self._lock = threading.Lock()

    def get(self, key: str) -> Any | None:
        """The value recorded for ``key``, or ``None``."""
        with self._lock:
            row = self._conn.execute("SELECT value FROM a3r_ledger WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, value: Any) -> None:
        """Record ``value`` (JSON-serialisable) for ``key`` (first write wins)."""
        with self._lock:
            self._conn.execute(
                "INSERT OR IGNORE INTO a3r_ledger (key, value) VALUES (?, ?)", (key, json.dumps(value))
            )

    def once(self, key: str, create: Callable[[], Any]) -> Any:
        """``create()`` the first time ``key`` is seen, the recorded result afterwards."""
        found = self.get(key)
        if found is not None:
            return found
        value = create()
        self.put(key, value)
        return self.get(key)

    def close(self) -> None:
        self._conn.close()


@dataclass
class RunContext:
    """What the nodes of one graph invocation share (not checkpointed).

    Attributes:
        store: The knowledge store.
        provider: Plans, writes code, proposes patches.
        ledger: Idempotency ledger.
        thread_id: The graph thread (``a3r resume THREAD``).
        root: Folder of study workspaces (``<root>/studies/<study id>``).
        model: ``swarm serve --model`` (``None``: the embedded model).
        server_url: Attach to this server instead of starting ones (vibe).
        admin_token: Admin token of the attached server (secret; memory only).
        auto_approve: Approve patches without asking (decided by ``policy:auto-approve``).
        budget_s: Wall-time budget of the whole thread, in seconds (runs are scheduled within it).
        hang_after_s: A run with no progress (step, episode counts, events, client records) for this
            long is hung.
        poll_s: Seconds between polls of a running server.
        max_patches: Patches proposed per thread at most.
        eval_tasks: Held-out tasks evaluated per run.
        eval_samples: Attempts per held-out task (>= 2 for pass@2).
        preflight_samples: Attempts per held-out task in the preflight (more attempts make a zero
            baseline meaningful: 0 of n correct bounds the success rate by about 3/n at 95%).
        episode_timeout_s: Per-episode time limit of evaluation clients.
        preflight_budget_s: Wall seconds the research preflight run may take, server start included
            (0: no budget): `PREFLIGHT_BUDGET_S`. Its held-out attempts still under way then are cut and
            count as no success (the verdict says how many, after how long and how many tokens).
        signal: When the preflight stops for lack of signal: the confidence and the share of informative
            GRPO groups of its sequential futility test (`a3r.study.sequential`).
        code_attempts: Attempts of an LLM provider at task code that passes its checks: after a failed
            check the provider sees the failure (traceback, failing self-check) and repairs its code;
            the thread stops after this many failures.
        server_options: Extra ``swarm serve`` options for every started server (e.g. ``max-batch-size``).
        notify: Progress callback (one line each), e.g. the CLI printer.
        servers: Live servers by server key.
        execute: Executes one run (`RunExecutor`; default: real swarm servers and clients).
        tenants: Whether a sweep stage's LoRA runs train side by side as tenants of one server, and how
            many at once (`a3r.swarmops.tenancy.TenantSettings`; only with the default ``execute``).
        clock_mark: When the thread's time last stopped being counted (`time.monotonic`): this
            invocation's start (a resume after a crash or a patch decision restarts it, so waiting is not
            counted), then the end of each run. The runner counts the time since as the next run's
            ``overhead_s``; the reporter, as the wrap-up after the last run.
    """

    store: Store
    provider: ResearchProvider
    ledger: Ledger
    thread_id: str
    root: Path
    model: str | None = None
    server_url: str | None = None
    admin_token: str | None = field(default=None, repr=False)
    auto_approve: bool = False
    budget_s: float = 3600.0
    hang_after_s: float = 180.0
    poll_s: float = 1.0
    max_patches: int = 2
    eval_tasks: int = 16
    eval_samples: int = 2
    preflight_samples: int = 4
    episode_timeout_s: float = 300.0
    preflight_budget_s: float = PREFLIGHT_BUDGET_S
    signal: SignalRule = field(default_factory=SignalRule)
    code_attempts: int = 3
    server_options: dict[str, Any] = field(default_factory=dict)
    notify: Callable[[str], None] | None = None
    servers: dict[str, ServerHandle] = field(default_factory=dict)
    execute: RunExecutor = execute_run
    tenants: TenantSettings = field(default_factory=TenantSettings)
    clock_mark: float = field(default_factory=time.monotonic)

    def budget_left_s(self, outcomes: Sequence[RunOutcome], now: float | None = None) -> float:
        """Seconds of the thread's budget left: less its runs with the time around them (`spent_s`),
        the time since ``clock_mark`` (this planning or analysis) and the report's wrap-up
        (`WRAP_UP_S`)."""
        since = max(0.0, (time.monotonic() if now is None else now) - self.clock_mark)
        return self.budget_s - spent_s(outcomes) - since - WRAP_UP_S

    def serving(self) -> Serving:
        """How the runner serves a sweep stage's runs, for their price (`a3r.study.price.stage_s`) and
        for the runner itself: as tenants of one server where tenants are on
        (`a3r.swarmops.tenancy.stage_pricing`) and ``execute`` is the real executor (a simulated one runs
        one at a time); else `a3r.study.price.SEQUENTIAL`."""
        if self.execute is not execute_run:
            return SEQUENTIAL
        return stage_pricing(self.tenants, self.server_options)

    def say(self, line: str) -> None:
        """Report progress (to ``notify``)."""
        if self.notify is not None:
            self.notify(line)

    def key(self, node: str, step: str) -> str:
        """Idempotency key of a side effect: thread id + node + step."""
        return f"{self.thread_id}:{node}:{step}"

    def close_servers(self) -> None:
        """Stop every server this context started."""
        for handle in list(self.servers.values()):
            handle.stop()
        self.servers.clear()
