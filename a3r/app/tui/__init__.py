"""The A3R terminal UI (``a3r tui``): oversight of studies and runs, and approval of patches.

Screens: studies → a study (plan and hypotheses; runs with status, latest metrics and the reward curve
of the highlighted run; the tail of its event log) → a run (stored curve, and live status, metrics and
ended episodes polled from ``Run.server_url``) → an episode token by token, coloured by loss mask.
Findings (``f``) and pending approvals (``p``) are one key away everywhere. The TUI works by keyboard
alone in 80×24 (over SSH too); store reads and server polls run in workers, off the UI thread.

Approval contract (what the research graph relies on):

1. The analyst proposes a patch (`memory.Store.propose_patch`); it is ``pending``. The graph pauses on
   a LangGraph ``interrupt()`` carrying the patch id.
2. A reviewer opens it here (``p``, Enter), reads the rationale, the syntax-highlighted diff and the
   evidence cited, and presses ``a`` or ``r`` (or a button); a dialog takes a note (required to reject).
3. The decision is written to the store with `memory.Store.decide_patch` (status ``approved`` or
   ``rejected``, ``decided_by`` = `TuiConfig.reviewer`, ``note``), then logged as a study event.
   **A patch decided in the store (status approved/rejected) is the resume signal.** In standalone
   ``a3r tui`` nothing else happens: a waiting graph polls ``store.get_patch(patch_id).status`` and
   resumes with ``Command(resume={"patch_id": id, "approved": status == "approved", "note": note})``.
4. When the TUI is embedded (``a3r vibe --tui``), the runner passes ``on_decision(patch_id, approved,
   note)`` (a `DecisionHook`), called once per decision **after** the store write succeeded: it
   resumes the thread directly. A plain function runs in a daemon thread of its own (it may block,
   e.g. train until the next interrupt; the UI never waits for it, and quitting the TUI does not
   either); a coroutine function runs on the UI loop. Calls are serialised in decision order. If it
   raises, the reviewer sees the error and the decision stays in the store, so a polling graph still
   resumes. The store write and the hook run in an app-level worker: leaving the review screen at
   once loses nothing.

A decision is taken exactly once: the store's compare-and-set on ``pending`` makes a second decider
(another TUI, a policy) fail with `memory.InvalidTransition`, shown as an error, and no hook is called.

Evidence: the rationale cites runs as ``run 12`` / ``runs 3, 4 and 5`` and episodes by id
(``ep-<hex>``); the review shows those runs' latest metrics (only the metric names the rationale
mentions, when it mentions any) and opens the cited episodes from the study's server (see
`a3r.app.tui._evidence`).

Example:
    >>> from memory import Store
    >>> from a3r.app.tui import A3RApp, TuiConfig
    >>> with Store(".a3r/memory.db") as store:  # doctest: +SKIP
    ...     A3RApp(store, config=TuiConfig(reviewer="ada"), on_decision=resume_thread).run()
"""

from typing import Unpack

from a3r.app.tui._app import A3RApp, AppOptions
from a3r.app.tui._config import TuiConfig
from a3r.app.tui._context import DecisionHookError, TuiContext
from a3r.app.tui._decision import Decision, DecisionHook
from a3r.app.tui._decision_dialog import DecisionDialog
from a3r.app.tui._evidence import PatchEvidence, cited_episodes, cited_runs, gather_evidence
from a3r.app.tui._patch_view import PatchView
from a3r.app.tui._reward_curve import RewardCurve
from a3r.app.tui._swarm import EpisodeSummary, LiveRun, RunMonitor
from a3r.app.tui._token_view import TokenSequence, TokenView, token_sequences
from a3r.app.tui._tokens import Detokenizer, HFDetokenizer
from memory import Store

__all__ = [
    "A3RApp",
    "AppOptions",
    "Decision",
    "DecisionDialog",
    "DecisionHook",
    "DecisionHookError",
    "Detokenizer",
    "EpisodeSummary",
    "HFDetokenizer",
    "LiveRun",
    "PatchEvidence",
    "PatchView",
    "RewardCurve",
    "RunMonitor",
    "TokenSequence",
    "TokenView",
    "TuiConfig",
    "TuiContext",
    "cited_episodes",
    "cited_runs",
    "gather_evidence",
    "run_tui",
    "token_sequences",
]


def run_tui(store: Store, **options: Unpack[AppOptions]) -> None:
    """Run the TUI in the foreground until the user quits (for ``a3r vibe --tui`` / ``--tui`` options).

    Arguments as for `A3RApp` (keywords: `AppOptions`). Run the research graph in another thread
    meanwhile; pass a function resuming its thread as ``on_decision``.
    """
    A3RApp(store, **options).run()
