"""The TUI following a run that a3r itself started: ``a3r vibe "train arithmetic" --steps 2`` in a
subprocess (its own ``swarm serve`` on the embedded model, its store and run dirs in a temporary folder),
and `A3RApp` on that store. While the training run goes on, its screen shows the server's live status and
per-step metrics and its episodes (listed with the admin token a3r left in the run dir); an episode's
token view shows each token's id, loss mask and logprob; once a3r has ended, the same screen reads the
run from its run dir."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from a3r.app.tui import A3RApp, HFDetokenizer, RewardCurve, TokenView, TuiConfig
from a3r.app.tui._episode_screen import EpisodeScreen
from a3r.app.tui._run_screen import RunScreen
from memory import RunPublic, RunStatus, Store
from tests.tui.conftest import cells, text_of, wait_for

pytestmark = pytest.mark.slow

A3R = [sys.executable, "-c", "from a3r.app.cli import main; main()"]
TOKEN_LINE = re.compile(r"token \d+/\d+ · id \d+ · '.*' · trained · logprob -?\d+\.\d{3} \(p [01]\.\d{3}\)")


@dataclass(frozen=True)
class A3RRun:
    """``a3r vibe`` running in ``folder`` (store ``folder/memory.db``, log ``folder/vibe.log``)."""

    process: subprocess.Popen[bytes]
    folder: Path

    @property
    def store_path(self) -> Path:
        return self.folder / "memory.db"

    def log(self) -> str:
        return (self.folder / "vibe.log").read_text(errors="replace")


@pytest.fixture()
def a3r_run(tmp_path: Path) -> Iterator[A3RRun]:
    """A tiny real a3r thread: a smoke run (one training step), then ``train-s0`` (step 1 → 2)."""
    with (tmp_path / "vibe.log").open("wb") as log:
        process = subprocess.Popen(
            [
                *A3R, "vibe", "train arithmetic", "--steps", "2", "--batch-size", "1", "--group-size", "2",
                "--auto-approve", "--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"),
            ],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path,
        )  # fmt: skip
    try:
        yield A3RRun(process, tmp_path)
    finally:
        if process.poll() is None:  # stopped like Ctrl-C: a3r stops its servers
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


def _training_run(run: A3RRun, timeout_s: float = 480.0) -> RunPublic:
    """The ``train-s0`` run once the store shows it running with its client started."""
    deadline = time.monotonic() + timeout_s
    while run.process.poll() is None and time.monotonic() < deadline:
        if run.store_path.exists():
            with Store(run.store_path) as store:
                for found in store.runs():
                    running = found.name == "train-s0" and found.status is RunStatus.running
                    if running and any("client started" in e.message for e in store.events(run_id=found.id)):
                        return found
        time.sleep(0.2)
    raise AssertionError(f"train-s0 did not start (a3r exit code {run.process.poll()}):\n{run.log()[-3000:]}")


async def test_the_tui_follows_a_run_a3r_started(a3r_run: A3RRun) -> None:
    training = _training_run(a3r_run)
    assert training.server_url and training.run_dir
    assert (Path(training.run_dir) / "admin.token").stat().st_mode & 0o777 == 0o600
    config = TuiConfig(refresh_s=0.3, request_timeout_s=5.0)
    with Store(a3r_run.store_path) as store:
        (study,) = store.studies()
        app = A3RApp(store, config=config, study_id=study.id, detokenize=HFDetokenizer(None))
        async with app.run_test(size=(120, 36)) as pilot:
            # The study screen lists a3r's runs; open train-s0 from it.
            await wait_for(pilot, lambda: "train-s0" in [row[1] for row in cells(app, "#runs")])
            position = [row[1] for row in cells(app, "#runs")].index("train-s0")
            await pilot.press(*["down"] * position, "enter")
            screen = app.screen
            assert isinstance(screen, RunScreen) and screen.run_id == training.id

            # Live, from a3r's server: status, the per-step metrics (step 1 came from the smoke run),
            # and the server's episodes (the admin routes, with the token a3r wrote into the run dir).
            await wait_for(pilot, lambda: "loss=" in text_of(app, "#live-status"), timeout_s=60)
            status = text_of(app, "#live-status")
            assert status.startswith("live ") and "policy step " in status, status
            assert screen.query_one("#live-curve", RewardCurve).values  # the live reward curve
            await wait_for(pilot, lambda: any(row[3] for row in cells(app, "#episodes")), timeout_s=60)
            rows = cells(app, "#episodes")
            assert all(row[1].startswith("arith-") for row in rows), rows

            # An ended episode, token by token: id, loss mask and logprob of a trained token.
            ended = next(i for i, row in enumerate(rows) if row[3])
            await pilot.press(*["down"] * ended, "enter")
            episode = app.screen
            assert isinstance(episode, EpisodeScreen) and episode.episode_id == rows[ended][0]
            view = episode.query_one(TokenView)
            await wait_for(pilot, lambda: view.sequences, timeout_s=30)
            shown = view.sequences[0]
            assert shown.ids and len(shown.ids) == len(shown.pieces) == len(shown.loss_mask)
            assert 0 < shown.trained < len(shown.pieces)  # a prompt (context) and a trained completion
            assert all(lp <= 0 for lp, m in zip(shown.logprobs, shown.loss_mask, strict=True) if m)
            await pilot.press("home")
            await pilot.pause()
            assert "context (not trained: no logprob)" in text_of(app, "#token-line")  # the prompt
            await pilot.press("end")  # the completion's last token
            await pilot.pause()
            line = text_of(app, "#token-line").strip()
            assert TOKEN_LINE.fullmatch(line), line
            assert f"· id {shown.ids[-1]} ·" in line
            await pilot.press("escape")
            assert app.screen is screen

            # a3r ends (its held-out evaluation, the report): the run is then read from its run dir.
            code = await asyncio.to_thread(a3r_run.process.wait, 480)
            assert code == 0, a3r_run.log()[-3000:]
            await wait_for(pilot, lambda: "ended read from" in text_of(app, "#live-status"), timeout_s=30)
            status = text_of(app, "#live-status")
            assert f"read from {training.run_dir}: 2 steps" in " ".join(status.split()), status
            assert len(screen.query_one("#live-curve", RewardCurve).values) == 2
            assert cells(app, "#episodes")
