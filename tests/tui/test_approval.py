"""Approve and reject flows against a real store: the decision (status, decided_by, note) lands in the
store, is logged as a study event, and the ``on_decision`` hook that resumes the research graph is
called exactly once, after the write. Keys alone, in 80×24."""

from __future__ import annotations

import asyncio
import threading

from textual.widgets import Button, Input, Label

from a3r.app.tui import A3RApp, DecisionDialog, PatchView, TuiConfig
from a3r.app.tui._approvals_screen import ApprovalsScreen
from a3r.app.tui._patch_screen import PatchScreen
from memory import PatchStatus, Store
from tests.tui.conftest import EPISODE_CITED, Seeded, cells, text_of, wait_for

SIZE = (80, 24)


async def _open_first_pending(app: A3RApp, pilot: object, seeded: Seeded) -> None:
    from textual.pilot import Pilot

    assert isinstance(pilot, Pilot)
    await pilot.press("p")
    assert isinstance(app.screen, ApprovalsScreen)
    await wait_for(pilot, lambda: len(cells(app, "#pending")) == 2)
    assert [row[:4] for row in cells(app, "#pending")] == [
        [str(seeded.patch_id), str(seeded.study_id), "reward.py v1", "analyst"],
        [str(seeded.second_patch_id), str(seeded.study_id), "reward.py v1", "analyst"],
    ]
    await pilot.press("enter")
    assert isinstance(app.screen, PatchScreen) and app.screen.patch.id == seeded.patch_id


async def test_approve_with_note_by_keys(store: Store, seeded: Seeded, config: TuiConfig) -> None:
    calls: list[tuple[int, bool, str | None, str]] = []
    release = threading.Event()

    def on_decision(patch_id: int, approved: bool, note: str | None) -> None:
        # Called after the store write, in a thread of its own: a graph resume may block for long.
        assert threading.current_thread() is not threading.main_thread()
        calls.append((patch_id, approved, note, store.get_patch(patch_id).status.value))
        release.wait(timeout=30)

    app = A3RApp(store, config=config, on_decision=on_decision)
    async with app.run_test(size=SIZE) as pilot:
        await _open_first_pending(app, pilot, seeded)
        view = app.screen.query_one(PatchView)
        await wait_for(pilot, lambda: view.evidence.runs)
        body = text_of(app, "#patch-body")
        assert "Run 2 collapsed" in body and "+    # partial credit" in body and "-    return float" in body
        # The evidence shows the cited runs with the metric the rationale names (reward/mean), not kl.
        assert [run.id for run in view.evidence.runs] == [seeded.run_ids[1], seeded.run_ids[0]]
        assert view.evidence.metrics == ("reward/mean",)
        assert view.evidence.episodes == (EPISODE_CITED,)
        assert "reward/mean=0" in body and "kl=" not in body

        await pilot.press("a")
        assert isinstance(app.screen, DecisionDialog) and app.screen.approve
        await pilot.press(*"fix matches the diagnosis", "enter")
        # The UI goes back to the list while the hook still runs (blocked on `release`).
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalsScreen))
        await wait_for(pilot, lambda: len(cells(app, "#pending")) == 1)
        assert cells(app, "#pending")[0][0] == str(seeded.second_patch_id)
        await wait_for(pilot, lambda: calls)
        assert not release.is_set()
        release.set()

    patch = store.get_patch(seeded.patch_id)
    assert patch.status is PatchStatus.approved
    assert patch.decided_by == "ada"
    assert patch.note == "fix matches the diagnosis"
    assert patch.decided_at is not None
    assert calls == [(seeded.patch_id, True, "fix matches the diagnosis", "approved")]
    assert store.get_patch(seeded.second_patch_id).status is PatchStatus.pending
    events = [e.message for e in store.events(study_id=seeded.study_id)]
    assert f"patch {seeded.patch_id} (reward.py) approved by ada: fix matches the diagnosis" in events


async def test_reject_needs_a_note_and_uses_the_button(
    store: Store, seeded: Seeded, config: TuiConfig
) -> None:
    decided = asyncio.Event()
    calls: list[tuple[int, bool, str | None]] = []

    async def on_decision(patch_id: int, approved: bool, note: str | None) -> None:
        calls.append((patch_id, approved, note))
        decided.set()

    app = A3RApp(store, config=config, on_decision=on_decision)
    async with app.run_test(size=SIZE) as pilot:
        await _open_first_pending(app, pilot, seeded)
        await pilot.click("#reject")
        dialog = app.screen
        assert isinstance(dialog, DecisionDialog) and not dialog.approve
        await pilot.press("enter")  # no note: refused, the dialog stays
        assert app.screen is dialog
        assert "needs a note" in str(dialog.query_one("#problem", Label).content)
        assert store.get_patch(seeded.patch_id).status is PatchStatus.pending
        await pilot.press(*"partial credit rewards wrong answers", "tab", "enter")
        await wait_for(pilot, decided.is_set)
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalsScreen))

    patch = store.get_patch(seeded.patch_id)
    assert (patch.status, patch.decided_by, patch.note) == (
        PatchStatus.rejected,
        "ada",
        "partial credit rewards wrong answers",
    )
    assert calls == [(seeded.patch_id, False, "partial credit rewards wrong answers")]


async def test_cancel_leaves_the_patch_pending(store: Store, seeded: Seeded, config: TuiConfig) -> None:
    calls: list[object] = []
    app = A3RApp(store, config=config, on_decision=lambda *args: calls.append(args))
    async with app.run_test(size=SIZE) as pilot:
        await _open_first_pending(app, pilot, seeded)
        await pilot.press("a", *"maybe", "escape")
        assert isinstance(app.screen, PatchScreen)
        await pilot.press("r")
        assert isinstance(app.screen, DecisionDialog)
        app.screen.query_one("#cancel", Button).press()
        await pilot.pause(0.2)
        assert isinstance(app.screen, PatchScreen)
    assert store.get_patch(seeded.patch_id).status is PatchStatus.pending
    assert calls == []


async def test_patch_decided_elsewhere_is_refused(store: Store, seeded: Seeded, config: TuiConfig) -> None:
    """Two reviewers (or a policy) race: the store's compare-and-set lets one win; the TUI reports the
    other decision and calls no hook."""
    calls: list[object] = []
    app = A3RApp(store, config=config, on_decision=lambda *args: calls.append(args))
    async with app.run_test(size=SIZE) as pilot:
        await _open_first_pending(app, pilot, seeded)
        await pilot.press("a")
        store.decide_patch(seeded.patch_id, approve=False, by="policy:max-diff", note="too large")
        await pilot.press("enter")
        await wait_for(pilot, lambda: any(n.title == "already decided" for n in app._notifications))
        assert isinstance(app.screen, ApprovalsScreen)
        await wait_for(pilot, lambda: len(cells(app, "#pending")) == 1)
    patch = store.get_patch(seeded.patch_id)
    assert (patch.status, patch.decided_by, patch.note) == (
        PatchStatus.rejected,
        "policy:max-diff",
        "too large",
    )
    assert calls == []


async def test_decided_patch_shows_its_decision_and_asks_nothing(
    store: Store, seeded: Seeded, config: TuiConfig
) -> None:
    app = A3RApp(store, config=TuiConfig(refresh_s=60, reviewer="ada"))
    async with app.run_test(size=SIZE) as pilot:
        await _open_first_pending(app, pilot, seeded)
        await pilot.press("escape")
        store.decide_patch(seeded.patch_id, approve=True, by="bob", note="ok")
        await pilot.press("enter")  # the list is stale (slow refresh): the review reads the store
        screen = app.screen
        assert isinstance(screen, PatchScreen)
        view = screen.query_one(PatchView)
        await wait_for(pilot, lambda: view.patch is not None and view.patch.status is PatchStatus.approved)
        assert all(button.disabled for button in view.query(Button))
        assert "approved by bob · note: ok" in text_of(app, "#patch-body")
        await pilot.press("a")
        assert app.screen is screen
        await wait_for(pilot, lambda: any("already approved" in n.message for n in app._notifications))


async def test_failing_hook_keeps_the_decision(store: Store, seeded: Seeded, config: TuiConfig) -> None:
    def on_decision(patch_id: int, approved: bool, note: str | None) -> None:
        raise ConnectionError("graph thread gone")

    app = A3RApp(store, config=config, on_decision=on_decision)
    async with app.run_test(size=SIZE) as pilot:
        await _open_first_pending(app, pilot, seeded)
        await pilot.press("a", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalsScreen))
        await wait_for(
            pilot,
            lambda: any(
                "on_decision failed: ConnectionError: graph thread gone" in n.message
                for n in app._notifications
            ),
        )
    patch = store.get_patch(seeded.patch_id)
    assert (patch.status, patch.note) == (PatchStatus.approved, None)


async def test_new_pending_patch_is_announced(store: Store, seeded: Seeded, config: TuiConfig) -> None:
    app = A3RApp(store, config=config, study_id=seeded.study_id, approvals=True)
    async with app.run_test(size=SIZE) as pilot:
        assert isinstance(app.screen, ApprovalsScreen) and app.screen.study_id == seeded.study_id
        await wait_for(pilot, lambda: len(cells(app, "#pending")) == 2)
        # The backlog at start-up is one notification, not one per patch.
        await wait_for(
            pilot, lambda: any(n.message == "2 patches await approval: press p" for n in app._notifications)
        )
        assert not any("patch #" in n.message for n in app._notifications)
        artifact = store.latest_artifact(seeded.study_id, "reward.py")
        assert artifact is not None
        third = store.propose_patch(artifact.id, diff="-a\n+b\n", rationale="third try")
        await wait_for(pilot, lambda: len(cells(app, "#pending")) == 3)
        await wait_for(pilot, lambda: any(f"patch #{third.id}" in n.message for n in app._notifications))
        assert not isinstance(app.screen.focused, Input)
