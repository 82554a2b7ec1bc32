"""The run screen against a real swarm server on loopback (a tiny random model that trains): live
status, the reward curve of the server's per-step metrics, ended episodes, and the token-level view of
an episode with loss-mask colouring; a server that is down is reported without blocking the screen."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam
from pydantic import SecretStr

from a3r.app.tui import A3RApp, HFDetokenizer, PatchView, RewardCurve, TokenView, TuiConfig
from a3r.app.tui._episode_screen import EpisodeScreen
from a3r.app.tui._patch_screen import PatchScreen
from a3r.app.tui._run_screen import RunScreen
from a3r.app.tui._token_view import TRAINED_STYLES, render_tokens
from memory import RunUpdate, Store
from swarm.batch import BatchConfig, BatchPolicy
from swarm.client import SwarmClient
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from swarm.protocol import EngineState, EpisodeCounts, ServerStepMetrics, StatusView
from swarm.train import TrainerConfig
from tests.conftest import LiveServer, build_tiny_model, free_port, make_server
from tests.tui.conftest import cells, text_of, wait_for

SIZE = (80, 24)
ADMIN = secrets.token_urlsafe(16)
"""The server's admin token: the TUI reads episodes it did not begin with it."""
QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Count to three."}]


@pytest.fixture(scope="module")
def trained_server(
    tmp_path_factory: pytest.TempPathFactory, embedded_source: Any, tokenizer: Any
) -> Iterator[tuple[LiveServer, list[ServerStepMetrics]]]:
    """A server that trained two steps on groups of 2 episodes (rewards 1 and 0, then 0.75 and 0.25),
    with its per-step metrics as served by ``GET /api/v1/metrics``."""
    engine = HFEngine(build_tiny_model(embedded_source, seed=3), tokenizer, "tiny-tui")
    training = TrainingConfig(
        batch=BatchConfig(policy=BatchPolicy.EPISODES, batch_size=1, group_size=2),
        trainer=TrainerConfig(lr=1e-3),
    )
    live = make_server(
        tmp_path_factory.mktemp("tui-server"), engine, training=training, admin_token=SecretStr(ADMIN)
    )
    try:
        with SwarmClient(live.url, admin_token=ADMIN) as client:
            for step, rewards in enumerate(((1.0, 0.0), (0.75, 0.25)), start=1):
                for reward in rewards:
                    with client.episode(f"count-{step}") as ep:
                        OpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.create(
                            model=ep.model, messages=QUESTION, max_tokens=6, temperature=1.0
                        )
                        ep.finish(reward)
                assert _wait(_trained(client, step)), f"the server did not train step {step}"
            metrics = client.metrics()
        yield live, metrics
    finally:
        live.stop()
        engine.close()


def _trained(client: SwarmClient, step: int) -> Callable[[], bool]:
    return lambda: client.status().step == step


def _wait(predicate: Callable[[], bool], timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _study_with_run(store: Store, server_url: str) -> tuple[int, int]:
    study = store.create_study("Does the tiny model learn to count?")
    experiment = store.create_experiment(study.id, "count")
    run = store.start_run(experiment.id, seed=0, server_url=server_url)
    store.log_metrics(run.id, step=1, metrics={"reward/mean": 0.5})
    return study.id, run.id


async def test_live_run_and_episode_tokens(
    store: Store, trained_server: tuple[LiveServer, list[ServerStepMetrics]], tokenizer: Any
) -> None:
    live, metrics = trained_server
    assert [m.reward_mean for m in metrics] == [0.5, 0.5]
    study_id, run_id = _study_with_run(store, live.url)
    config = TuiConfig(refresh_s=0.5, reviewer="ada", admin_token=SecretStr(ADMIN))  # reads any episode
    app = A3RApp(store, config=config, study_id=study_id, detokenize=HFDetokenizer.from_tokenizer(tokenizer))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(cells(app, "#runs")) == 1)
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.run_id == run_id
        await wait_for(
            pilot, lambda: screen.live is not None and len(screen.live.episodes) == 4, timeout_s=20
        )
        status = text_of(app, "#live-status")
        assert "policy step 2" in status and "tiny-tui" in status and "trained 4" in status
        assert f"loss={metrics[-1].loss:.4g}" in status
        curve = screen.query_one("#live-curve", RewardCurve)
        assert curve.metric == "live reward_mean" and curve.values == (0.5, 0.5)
        rows = cells(app, "#episodes")
        # Newest first, with the rewards the client reported.
        assert [row[1:] for row in rows] == [
            ["count-2", "finished", "0.25"],
            ["count-2", "finished", "0.75"],
            ["count-1", "finished", "0"],
            ["count-1", "finished", "1"],
        ]
        episode_id = rows[0][0]

        await pilot.press("enter")
        episode_screen = app.screen
        assert isinstance(episode_screen, EpisodeScreen) and episode_screen.episode_id == episode_id
        view = episode_screen.query_one(TokenView)
        await wait_for(pilot, lambda: view.sequences, timeout_s=20)
        with SwarmClient(live.url, admin_token=ADMIN) as client:
            record = client.get_episode(episode_id)
        (sample,) = record.samples
        (shown,) = view.sequences
        # Every token is shown once, in order, with the sample's loss mask.
        assert "".join(shown.pieces) == tokenizer.decode(sample.input_ids)
        assert shown.loss_mask == tuple(sample.loss_mask)
        assert shown.trained == len(record.calls[0].completion_ids) > 0
        # Trained tokens are highlighted, context tokens are not.
        text = render_tokens(shown)
        trained_text = "".join(
            text.plain[span.start : span.end] for span in text.spans if span.style in TRAINED_STYLES
        )
        assert trained_text.replace("↵", "") == tokenizer.decode(record.calls[0].completion_ids)
        info = text_of(app, "#episode-info")
        assert "finished" in info and "reward 0.25" in info and "1 calls, 1 samples" in info


async def _open_the_run(pilot: Any, app: A3RApp) -> RunScreen:
    """From the study screen, open its only run."""
    await wait_for(pilot, lambda: len(cells(app, "#runs")) == 1)
    await pilot.press("enter")
    screen = app.screen
    assert isinstance(screen, RunScreen)
    return screen


async def test_unreachable_server_is_reported(store: Store) -> None:
    study_id, _ = _study_with_run(store, f"http://127.0.0.1:{free_port()}")
    app = A3RApp(store, config=TuiConfig(refresh_s=0.5, request_timeout_s=2.0), study_id=study_id)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open_the_run(pilot, app)
        await wait_for(pilot, lambda: screen.live is not None)
        assert "cannot reach http://127.0.0.1:" in text_of(app, "#live-status")
        assert screen.query_one("#live-curve", RewardCurve).title_text.endswith("server unreachable")
        # The stored curve is still drawn, and the screen still answers keys.
        assert screen.query_one("#stored-curve", RewardCurve).values == (0.5,)
        await pilot.press("escape")
        assert not isinstance(app.screen, RunScreen)


async def test_cited_episode_opens_from_the_patch_review(
    store: Store, trained_server: tuple[LiveServer, list[ServerStepMetrics]], tokenizer: Any
) -> None:
    live, _ = trained_server
    study_id, run_id = _study_with_run(store, live.url)
    config = TuiConfig(refresh_s=0.5, admin_token=SecretStr(ADMIN))
    app = A3RApp(store, config=config, detokenize=HFDetokenizer.from_tokenizer(tokenizer))
    async with app.run_test(size=SIZE) as pilot:
        # Find an episode id through the run screen, as a reviewer would.
        await app.push_screen(RunScreen(app.ctx, run_id))
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and len(cells(app, "#episodes")) == 4)
        episode_id = cells(app, "#episodes")[-1][0]
        artifact = store.add_artifact(study_id, "workflow", "workflow.py", "async def run(task, llm): ...\n")
        patch = store.propose_patch(
            artifact.id, diff="-a\n+b\n", rationale=f"In run {run_id}, {episode_id} counts wrongly."
        )
        await pilot.press("escape", "p")
        await wait_for(pilot, lambda: cells(app, "#pending"))
        await pilot.press("enter")
        review = app.screen
        assert isinstance(review, PatchScreen) and review.patch.id == patch.id
        view = review.query_one(PatchView)
        await wait_for(pilot, lambda: view.evidence.episodes == (episode_id,))
        assert view.evidence.server_url == live.url
        await pilot.press("tab", "enter")  # focus the cited episodes, open the first
        screen = app.screen
        assert isinstance(screen, EpisodeScreen) and screen.episode_id == episode_id
        await wait_for(pilot, lambda: screen.query_one(TokenView).sequences, timeout_s=20)
        assert "reward 1" in text_of(app, "#episode-info")


class _SlowControlHandler(BaseHTTPRequestHandler):
    """The swarm control routes the run screen reads, answering after ``delay_s`` (a slow server)."""

    delay_s = 0.8
    status = StatusView(
        state=EngineState.ROLLING,
        step=7,
        model="slow-model",
        episodes=EpisodeCounts(finished=3),
        uptime_s=10.0,
        run_dir="/tmp/slow",
        training_enabled=True,
    )

    def do_GET(self) -> None:
        time.sleep(self.delay_s)
        path = self.path.split("?")[0]
        body, kind = {
            "/api/v1/status": (self.status.model_dump_json(), "application/json"),
            "/api/v1/metrics": ("[]", "application/json"),
            "/api/v1/events": ("", "text/event-stream"),
        }.get(path, ('{"error": {"type": "not_found", "message": "no route"}}', "application/json"))
        self.send_response(200 if path.startswith("/api/v1/") else 404)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: Any) -> None:
        return


async def test_server_slower_than_the_refresh_is_still_shown(store: Store) -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _SlowControlHandler)
    serving = threading.Thread(target=httpd.serve_forever, daemon=True)
    serving.start()
    try:
        _, run_id = _study_with_run(store, f"http://127.0.0.1:{httpd.server_port}")
        app = A3RApp(store, config=TuiConfig(refresh_s=0.3))
        async with app.run_test(size=SIZE) as pilot:
            await app.push_screen(RunScreen(app.ctx, run_id))
            screen = app.screen
            assert isinstance(screen, RunScreen)
            await wait_for(
                pilot, lambda: screen.live is not None and screen.live.status is not None, timeout_s=15
            )
            assert "policy step 7 · slow-model" in text_of(app, "#live-status")
            assert screen.live is not None and screen.live.metrics == []
            assert screen.query_one("#live-curve", RewardCurve).title_text.endswith("no training steps yet")
    finally:
        httpd.shutdown()
        httpd.server_close()


async def test_a_finished_run_is_read_from_its_run_dir(
    store: Store, trained_server: tuple[LiveServer, list[ServerStepMetrics]]
) -> None:
    """Found by a fresh user: after an a3r run ended its episodes were in its server's pool.db, and the
    TUI showed none. An ended run with a run dir is read from there (pool.db, metrics.jsonl)."""
    live, _ = trained_server
    study_id, run_id = _study_with_run(store, f"http://127.0.0.1:{free_port()}")  # its server is gone
    store.update_run(run_id, RunUpdate(run_dir=str(live.config.run_dir)))
    store.finish_run(run_id)
    app = A3RApp(store, config=TuiConfig(refresh_s=0.5, request_timeout_s=2.0), study_id=study_id)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open_the_run(pilot, app)
        await wait_for(pilot, lambda: len(cells(app, "#episodes")) == 4, timeout_s=20)
        assert [row[1] for row in cells(app, "#episodes")] == ["count-2", "count-2", "count-1", "count-1"]
        assert "ended read from" in text_of(app, "#live-status") and "2 steps" in text_of(app, "#live-status")
        assert screen.query_one("#live-curve", RewardCurve).values == (0.5, 0.5)
        await pilot.press("enter")
        view = app.screen.query_one(TokenView)
        await wait_for(pilot, lambda: view.sequences, timeout_s=20)
        (call,) = view.sequences  # read from the pool: the episode's call, ids and logprobs included
        assert (
            call.ids
            and call.trained > 0
            and all(lp < 0 for lp, m in zip(call.logprobs, call.loss_mask, strict=True) if m)
        )
        assert "token 1/" in text_of(app, "#token-line")


async def test_runs_sharing_a_run_dir_list_only_their_own_episodes(
    store: Store, trained_server: tuple[LiveServer, list[ServerStepMetrics]], tmp_path: Any
) -> None:
    """Found by a fresh user: a study's smoke, training and continuation runs and its held-out evaluation
    share one server and run dir, and "Run 4 — train-s0-c" listed the others' episodes. a3r runs each
    run's client as ``a3r-<run name>``: a run a3r started lists only that client's episodes, from its run
    dir and live from its server."""
    import shutil
    import sqlite3

    from a3r.app.tui._run_dir import POOL_FILE, RunDirReader, run_client_id
    from a3r.app.tui._swarm import RunMonitor

    live, _ = trained_server
    run_dir = tmp_path / "main-s0"
    shutil.copytree(live.config.run_dir, run_dir)
    with sqlite3.connect(run_dir / POOL_FILE) as db:  # step 1's episodes: the smoke run; step 2's: eval
        db.execute("UPDATE episodes SET client_id = 'a3r-smoke' WHERE task_id = 'count-1'")
        db.execute("UPDATE episodes SET client_id = 'a3r-eval' WHERE task_id = 'count-2'")
    db.close()
    study_id, run_id = _study_with_run(store, f"http://127.0.0.1:{free_port()}")
    store.update_run(run_id, RunUpdate(name="smoke", config={"purpose": "smoke"}, run_dir=str(run_dir)))
    store.finish_run(run_id)
    assert run_client_id("smoke", {"purpose": "smoke"}) == "a3r-smoke"
    assert run_client_id("mine", {}) is None  # not started by a3r: every episode of its server
    app = A3RApp(store, config=TuiConfig(refresh_s=0.5, request_timeout_s=2.0), study_id=study_id)
    async with app.run_test(size=SIZE) as pilot:
        await _open_the_run(pilot, app)
        await wait_for(pilot, lambda: len(cells(app, "#episodes")) == 2, timeout_s=20)
        await pilot.pause(0.6)  # a later refresh lists no other run's episodes either
        assert [row[1] for row in cells(app, "#episodes")] == ["count-1", "count-1"]
    everything = await RunDirReader(run_dir).poll()
    assert len(everything.episodes) == 4

    async def served(client_id: str | None) -> list[Any]:
        monitor = RunMonitor(live.url, admin_token=ADMIN, client_id=client_id)
        try:
            return (await monitor.poll()).episodes
        finally:
            await monitor.aclose()

    (client,) = {ep.client_id for ep in await served(None)}
    assert client and len(await served(client)) == 4 and not await served("a3r-other")


def test_the_admin_token_file_is_the_owners_only(tmp_path: Any) -> None:
    from a3r.app.tui._context import TuiContext
    from a3r.swarmops.credentials import TOKEN_FILE, read_admin_token, write_admin_token

    path = write_admin_token(tmp_path, "s3cret-token")
    assert path.name == TOKEN_FILE and (path.stat().st_mode & 0o777) == 0o600
    assert read_admin_token(tmp_path) == "s3cret-token" and read_admin_token(None) is None
    context = TuiContext(store=None, config=TuiConfig())  # type: ignore[arg-type]
    assert context.admin_token_for(str(tmp_path)) == "s3cret-token"
    flag = secrets.token_urlsafe(16)
    given = TuiContext(store=None, config=TuiConfig(admin_token=flag))  # type: ignore[arg-type]
    assert given.admin_token_for(str(tmp_path)) == flag
    path.chmod(0o644)  # readable by others: not trusted
    assert read_admin_token(tmp_path) is None


async def _settled(pilot: Any) -> None:
    """Let a table's columns take their contents' widths (measured when the table is idle) and the
    screen lay itself out again: a screenshot taken before shows every cell cut to its header's width.
    Settled = the rendered screen unchanged over three checks 0.1 s apart (a loaded machine measures
    late), at most 15 s."""
    import time

    previous, same, deadline = None, 0, time.monotonic() + 15
    while same < 3 and time.monotonic() < deadline:
        await pilot.pause(0.1)
        current = pilot.app.export_screenshot()
        same = same + 1 if current == previous else 0
        previous = current


async def test_screenshots_of_the_main_screens(
    store: Store, trained_server: tuple[LiveServer, list[ServerStepMetrics]], tokenizer: Any, tmp_path: Any
) -> None:
    """SVG screenshots of the studies, study, run and token screens over a real trained run (read from
    its run dir). ``A3R_SCREENSHOTS=docs/tui`` writes them there (the README shows them)."""
    import os
    from pathlib import Path

    folder = Path(os.environ.get("A3R_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    live, _ = trained_server
    _, run_id = _study_with_run(store, live.url)
    store.update_run(run_id, RunUpdate(name="train-s0", run_dir=str(live.config.run_dir)))
    store.finish_run(run_id, final_metrics={"reward_mean": 0.5, "steps": 2})
    config = TuiConfig(refresh_s=0.5, request_timeout_s=2.0)
    app = A3RApp(store, config=config, detokenize=HFDetokenizer.from_tokenizer(tokenizer))
    shots = []
    async with app.run_test(size=(132, 32)) as pilot:  # wide enough that no panel cuts its text
        await wait_for(pilot, lambda: cells(app, "#studies"))
        await _settled(pilot)
        shots.append(app.save_screenshot("studies.svg", str(folder)))
        await pilot.press("enter")
        await wait_for(pilot, lambda: cells(app, "#runs"))
        await _settled(pilot)
        shots.append(app.save_screenshot("study.svg", str(folder)))
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(cells(app, "#episodes")) == 4, timeout_s=20)
        await _settled(pilot)
        shots.append(app.save_screenshot("run.svg", str(folder)))
        await pilot.press("enter")
        view = app.screen.query_one(TokenView)
        await wait_for(pilot, lambda: view.sequences, timeout_s=20)
        await pilot.press(*["right"] * (len(view.sequences[0].pieces) - 2))  # onto a completion token
        await pilot.pause()
        shots.append(app.save_screenshot("tokens.svg", str(folder)))
    texts = [Path(shot).read_text(encoding="utf-8") for shot in shots]
    assert all(text.startswith("<svg") for text in texts)
    assert "train-s0" in texts[1] and "count-2" in texts[2] and "logprob" in texts[3]
    # Found by a fresh user: "trai", "finish", "reward/mean=0." and panel titles cut to "(1" and "(2".
    study, run = (text.replace("&#160;", " ") for text in texts[1:3])
    assert "train-s0 " in study and "finished " in study and "reward/mean=0.5 " in study
    assert "(1 steps)" in study and "(1 steps)" in run and "(2 steps)" in run
