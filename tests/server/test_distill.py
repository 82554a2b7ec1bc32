"""On-policy distillation against a real teacher server on loopback (issue 38).

The teacher is a second swarm server over a tiny model of the embedded architecture with other weights
(seed 7, training off); the student is a training server over another (seed 1) with ``--teacher``. Both
use the real SmolLM2 tokenizer, so the tokenizer check passes; a mismatch is shown with a local stand-in
speaking vLLM's wire format.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from openai import OpenAI
from pydantic import SecretStr

from swarm.batch import BatchConfig, BatchPolicy
from swarm.client import SwarmClient
from swarm.config import DistillConfig, TrainingConfig
from swarm.engine import HFEngine
from swarm.protocol import Limits
from swarm.train import TrainerConfig
from tests.conftest import LiveServer, build_tiny_model, make_server, wait_for

QUESTION = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def teacher_model(embedded_source: Any) -> Any:
    return build_tiny_model(embedded_source, seed=7)


@pytest.fixture(scope="module")
def teacher(
    tmp_path_factory: pytest.TempPathFactory, teacher_model: Any, tokenizer: Any
) -> Iterator[LiveServer]:
    engine = HFEngine(teacher_model, tokenizer, "tiny-teacher")
    live = make_server(tmp_path_factory.mktemp("teacher"), engine, training=TrainingConfig(enabled=False))
    yield live
    live.stop()
    engine.close()


@pytest.fixture()
def student_engine(embedded_source: Any, tokenizer: Any) -> Iterator[HFEngine]:
    engine = HFEngine(build_tiny_model(embedded_source, seed=1), tokenizer, "tiny-student")
    yield engine
    engine.close()


def forward_logprobs(model: Any, token_ids: list[int], start: int) -> list[float]:
    """The teacher's own forward pass: log p(token_ids[i] | token_ids[:i]) for i in [start, len)."""
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[i - 1, token_ids[i]]) for i in range(start, len(token_ids))]


def distill_config(teacher_url: str, **kw: Any) -> TrainingConfig:
    return TrainingConfig(
        batch=BatchConfig(policy=BatchPolicy.EPISODES, batch_size=1, group_size=2),
        trainer=TrainerConfig(lr=1e-3),
        distill=DistillConfig(teacher_url=teacher_url, **kw),
    )


def rollout(client: SwarmClient, task_id: str, reward: float) -> str:
    with client.episode(task_id) as ep:
        OpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.create(
            model=ep.model, messages=QUESTION, max_tokens=5, temperature=1.0
        )
        ep.finish(reward)
    return ep.id


def test_score_route_equals_the_teachers_own_forward_pass(teacher: LiveServer, teacher_model: Any) -> None:
    ids = [1, 504, 3458, 314, 260, 1789, 30, 2]
    answer = httpx.post(f"{teacher.url}/v1/score", json={"token_ids": ids, "start": 3}).json()
    expected = forward_logprobs(teacher_model, ids, 3)
    assert answer["policy_version"] == 0 and len(answer["logprobs"]) == len(ids) - 3
    assert answer["logprobs"] == pytest.approx(expected, abs=1e-5)
    bad = httpx.post(f"{teacher.url}/v1/score", json={"token_ids": ids, "start": 0})
    assert bad.status_code == 422  # start >= 1: position 0 has no context
    out = httpx.post(f"{teacher.url}/v1/score", json={"token_ids": ids, "start": 9})
    assert (
        out.status_code == 422 and "start" in out.json()["error"]["message"]
    )  # as start 0: the body's bounds


def test_pure_distillation_trains_on_the_hand_computed_reverse_kl(
    tmp_path: Path, teacher: LiveServer, teacher_model: Any, student_engine: HFEngine
) -> None:
    live = make_server(tmp_path, student_engine, training=distill_config(teacher.url))
    try:
        ignored = httpx.patch(f"{live.url}/api/v1/config", json={"distill_coef": 2.0})
        assert ignored.status_code == 422  # pure mode has no coefficient: refused, not silently ignored
        assert "only weighs the reverse KL in mixed mode" in ignored.json()["error"]["message"]
        with SwarmClient(live.url) as client:
            ids = [rollout(client, "t1", 1.0), rollout(client, "t1", 0.0)]
            wait_for(lambda: client.status().step == 1, what="step 1")
            views = [client.get_episode(i) for i in ids]
        row = httpx.get(f"{live.url}/api/v1/metrics").json()[0]
    finally:
        live.stop()
    kl_advantages: list[float] = []
    for view in views:
        assert view.trained_step == 1
        for call in view.calls:
            full = [*call.prompt_ids, *call.completion_ids]
            expected = forward_logprobs(teacher_model, full, len(call.prompt_ids))
            assert call.teacher_logprobs == pytest.approx(expected, abs=1e-5)  # stored with the record
        for sample in view.samples:
            assert sample.teacher_logprobs is not None
            for t, trained in enumerate(sample.loss_mask):
                if trained:
                    kl_advantages.append(sample.teacher_logprobs[t] - sample.behaviour_logprobs[t])
                else:
                    assert sample.teacher_logprobs[t] is None
    assert kl_advantages
    # pure: the per-token advantages the trainer got are the reverse-KL ones (not the GRPO ±1)
    assert row["adv_mean"] == pytest.approx(sum(kl_advantages) / len(kl_advantages), abs=1e-6)
    assert row["adv_min"] == pytest.approx(min(kl_advantages), abs=1e-6)
    distill = row["distill"]
    assert distill["teacher_kl"] == pytest.approx(-sum(kl_advantages) / len(kl_advantages), abs=1e-6)
    assert distill["teacher_kl/default"] == pytest.approx(distill["teacher_kl"])
    assert distill["scored_frac"] == 1.0 and distill["unscored_episodes"] == 0
    assert distill["teacher_latency_s"] > 0


def episode_kl_advantages(view: Any) -> list[float]:
    """teacher − behaviour logprob at every trained token of an episode's samples."""
    out = []
    for sample in view.samples:
        for t, trained in enumerate(sample.loss_mask):
            if trained:
                out.append(sample.teacher_logprobs[t] - sample.behaviour_logprobs[t])
    return out


def test_mixed_distillation_adds_the_live_coefficient_times_the_reverse_kl(
    tmp_path: Path, teacher: LiveServer, student_engine: HFEngine
) -> None:
    live = make_server(tmp_path, student_engine, training=distill_config(teacher.url, mode="mixed", coef=0.5))
    try:
        changed = httpx.patch(f"{live.url}/api/v1/config", json={"distill_coef": 2.0})
        assert changed.status_code == 200, changed.text
        assert changed.json()["config"]["training"]["distill"]["coef"] == 2.0
        refused = httpx.patch(f"{live.url}/api/v1/config", json={"distill_coef": -1.0})
        assert refused.status_code == 422
        with SwarmClient(live.url) as client:
            ids = [rollout(client, "t1", 1.0), rollout(client, "t1", 0.0)]
            wait_for(lambda: client.status().step == 1, what="step 1")
            views = [client.get_episode(i) for i in ids]
        row = httpx.get(f"{live.url}/api/v1/metrics").json()[0]
    finally:
        live.stop()
    # GRPO advantages of rewards (1, 0) in one group: ±0.5 / (0.5 + 1e-6)
    task = {ids[0]: 0.5 / (0.5 + 1e-6), ids[1]: -0.5 / (0.5 + 1e-6)}
    per_token = [task[v.episode_id] + 2.0 * a for v in views for a in episode_kl_advantages(v)]
    assert row["adv_mean"] == pytest.approx(sum(per_token) / len(per_token), abs=1e-5)
    assert row["adv_max"] == pytest.approx(max(per_token), abs=1e-5)


def test_a_server_without_a_teacher_refuses_distill_coef(tmp_path: Path, student_engine: HFEngine) -> None:
    live = make_server(tmp_path, student_engine, training=TrainingConfig())
    try:
        refused = httpx.patch(f"{live.url}/api/v1/config", json={"distill_coef": 2.0})
        status = httpx.get(f"{live.url}/api/v1/status").json()
    finally:
        live.stop()
    assert refused.status_code == 422 and "--teacher" in refused.json()["error"]["message"]
    assert "distill" not in status  # a server without a teacher answers as before


# retry_after_s 60: step 2 comes long before the backoff ends, so `second` trains with it only because the
# teacher answered for `third` meanwhile (it is back); 0.5: either way, depending on how fast step 2 comes.
@pytest.mark.parametrize("retry_after_s", [0.5, 60.0])
def test_a_teacher_outage_keeps_unscored_episodes_pooled_until_the_teacher_is_back(
    tmp_path: Path, teacher_model: Any, tokenizer: Any, student_engine: HFEngine, retry_after_s: float
) -> None:
    teacher_engine = HFEngine(teacher_model, tokenizer, "tiny-teacher")
    down = make_server(tmp_path / "teacher", teacher_engine, training=TrainingConfig(enabled=False))
    config = distill_config(down.url, wait_s=3.0, retry_after_s=retry_after_s, attempts=2, timeout_s=2.0)
    live = make_server(tmp_path / "student", student_engine, training=config)
    try:
        with SwarmClient(live.url) as client:
            first = rollout(client, "t1", 1.0)
            wait_for(lambda: all(c.teacher_logprobs for c in client.get_episode(first).calls), what="scored")
            down.stop()  # the teacher goes away
            second = rollout(client, "t1", 0.0)
            wait_for(lambda: client.status().step == 1, what="step 1 (on the scored episode only)")
            assert client.get_episode(first).trained_step == 1
            assert client.get_episode(second).trained_step is None  # left out, still pooled
            assert all(c.teacher_logprobs is None for c in client.get_episode(second).calls)
            row = httpx.get(f"{live.url}/api/v1/metrics").json()[0]
            assert row["episodes"] == 1 and row["distill"]["unscored_episodes"] == 1
            assert 0 < row["distill"]["scored_frac"] < 1
            events = (tmp_path / "student" / "run" / "events.jsonl").read_text()
            assert "distill.unscored" in events and second in events
            down.start()  # the teacher is back (same port): the pooled episode is scored and trained
            third = rollout(client, "t1", 0.5)
            wait_for(lambda: client.status().step == 2, what="step 2")
            assert (
                client.get_episode(second).trained_step == 2 and client.get_episode(third).trained_step == 2
            )
            row = httpx.get(f"{live.url}/api/v1/metrics").json()[1]
            assert row["episodes"] == 2 and row["distill"]["unscored_episodes"] == 0
            assert row["distill"]["scored_frac"] == 1.0
    finally:
        live.stop()
        if down._server is not None and not down._server.should_exit:
            down.stop()
        teacher_engine.close()


class VllmStandIn:
    """A local stand-in for vLLM's OpenAI server (``vllm serve``) speaking its wire format for what the
    teacher client uses: ``GET /v1/models``, ``POST /tokenize`` and ``POST /v1/completions`` with
    ``prompt_logprobs`` (vLLM's ``CompletionResponseChoice.prompt_logprobs``: ``null`` for the first
    position, then ``{"<id>": {"logprob", "rank", "decoded_token"}}`` with the position's own token and,
    where it differs, the top-1 token). Logprobs come from a real model's forward pass.

    Args:
        model: the model whose logprobs it serves.
        tokenizer: the tokenizer ``/tokenize`` uses; ``shift`` adds to every id (another tokenizer).
        token: the bearer credential it wants.
    """

    def __init__(self, model: Any, tokenizer: Any, token: str, shift: int = 0) -> None:
        import threading

        import uvicorn
        from fastapi import FastAPI, Header, HTTPException, Response

        from tests.conftest import free_port

        self.requests: list[dict[str, Any]] = []
        self.distort: Callable[[float], float] | None = None
        """Applied to each position's own logprob when set (a broken teacher: +50, NaN, -inf…)."""
        app = FastAPI()

        def check(authorization: str | None) -> None:
            if authorization != f"Bearer {token}":
                raise HTTPException(401, "Unauthorized")

        @app.get("/v1/models")
        def models(authorization: str | None = Header(None)) -> dict[str, Any]:
            check(authorization)
            card = {
                "id": "tiny-vllm",
                "object": "model",
                "created": 0,
                "owned_by": "vllm",
                "max_model_len": 8192,
            }
            return {"object": "list", "data": [card]}

        @app.post("/tokenize")
        def tokenize(body: dict[str, Any], authorization: str | None = Header(None)) -> dict[str, Any]:
            check(authorization)
            ids = tokenizer.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))
            ids = [i + shift for i in ids]
            return {"count": len(ids), "max_model_len": 8192, "tokens": ids, "token_strs": None}

        @app.post("/v1/completions")
        def completions(body: dict[str, Any], authorization: str | None = Header(None)) -> Response:
            check(authorization)
            self.requests.append(body)
            ids, k = body["prompt"], body["prompt_logprobs"]
            assert isinstance(ids, list) and k == 0 and body["max_tokens"] >= 1
            with torch.no_grad():
                logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
            positions: list[Any] = [None]
            for i in range(1, len(ids)):
                row = logprobs[i - 1]
                own = float(row[ids[i]]) if self.distort is None else self.distort(float(row[ids[i]]))
                entry = {str(ids[i]): {"logprob": own, "rank": int((row > row[ids[i]]).sum()) + 1}}
                top = int(row.argmax())
                entry.setdefault(str(top), {"logprob": float(row[top]), "rank": 1})
                for value in entry.values():
                    value["decoded_token"] = "x"
                positions.append(entry)
            choice = {
                "index": 0,
                "text": "x",
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "prompt_logprobs": positions,
                "prompt_token_ids": None,
            }
            usage = {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}
            answer = {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 0,
                "model": "tiny-vllm",
                "choices": [choice],
                "usage": usage,
            }
            # json.dumps writes NaN and ±Infinity as a broken teacher would (httpx reads them back)
            return Response(json.dumps(answer), media_type="application/json")

        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, 30, "the vLLM stand-in")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"  # as users often write vLLM's URL

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def vllm_teacher_student(
    tmp_path: Path, teacher_model: Any, tokenizer: Any, student_engine: HFEngine, **distill: Any
) -> tuple[VllmStandIn, LiveServer, str]:
    """A vLLM-wire stand-in teacher with a fresh token, and a started student server distilling from it."""
    import secrets

    from pydantic import SecretStr

    from swarm.config import ServerConfig
    from tests.conftest import free_port

    token = secrets.token_urlsafe(16)
    vllm = VllmStandIn(teacher_model, tokenizer, token)
    config = ServerConfig(
        run_dir=tmp_path / "run",
        port=free_port(),
        training=distill_config(vllm.url, **distill),
        teacher_token=SecretStr(token),
    )
    return vllm, LiveServer(config, student_engine).start(), token


def test_a_vllm_teacher_scores_through_prompt_logprobs(
    tmp_path: Path, teacher_model: Any, tokenizer: Any, student_engine: HFEngine
) -> None:
    vllm, live, token = vllm_teacher_student(tmp_path, teacher_model, tokenizer, student_engine)
    try:
        with SwarmClient(live.url) as client:
            ids = [rollout(client, "t1", 1.0), rollout(client, "t1", 0.0)]
            wait_for(lambda: client.status().step == 1, what="step 1")
            views = [client.get_episode(i) for i in ids]
    finally:
        live.stop()
        vllm.stop()
    assert vllm.requests and all(r["model"] == "tiny-vllm" for r in vllm.requests)
    for view in views:
        assert view.trained_step == 1
        for call in view.calls:
            expected = forward_logprobs(
                teacher_model, [*call.prompt_ids, *call.completion_ids], len(call.prompt_ids)
            )
            assert call.teacher_logprobs == pytest.approx(expected, abs=1e-5)
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert "teacher.connected" in events and token not in events


def test_a_teacher_with_another_tokenizer_or_credential_is_refused_at_start(
    teacher_model: Any, tokenizer: Any, teacher: LiveServer
) -> None:
    from swarm.server.teacher import TeacherError, TeacherMismatch, TeacherSettings, check_teacher

    token = secrets.token_urlsafe(16)
    other = VllmStandIn(teacher_model, tokenizer, token, shift=1)
    try:
        with pytest.raises(TeacherMismatch, match="another tokenizer"):
            check_teacher(TeacherSettings(url=other.url, token=SecretStr(token)), tokenizer)
        with pytest.raises(TeacherError, match="401") as refused:
            check_teacher(TeacherSettings(url=other.url, token=SecretStr("wrong-" + token)), tokenizer)
        assert token not in str(refused.value)
    finally:
        other.stop()
    info = check_teacher(TeacherSettings(url=teacher.url), tokenizer)  # a swarm teacher: fingerprints
    assert info.kind == "swarm" and info.model == "tiny-teacher"
    fingerprint = httpx.post(f"{teacher.url}/tokenize", json={"prompt": "hi"}).json()["tokenizer_fingerprint"]
    assert len(fingerprint) == 64


def test_swarm_serve_refuses_a_tokenizer_mismatch_in_one_line_with_exit_2(
    tmp_path: Path, teacher_model: Any, tokenizer: Any
) -> None:
    import os
    import secrets
    import subprocess
    import sys

    from tests.conftest import free_port

    token = secrets.token_urlsafe(16)
    other = VllmStandIn(teacher_model, tokenizer, token, shift=1)
    try:
        cmd = [sys.executable, "-m", "swarm.cli", "serve", "--port", str(free_port()), "--threads", "1"]
        cmd += ["--run-dir", str(tmp_path / "run"), "--teacher", other.url, "--distill", "mixed"]
        done = subprocess.run(
            cmd, env={**os.environ, "SWARM_TEACHER_TOKEN": token}, capture_output=True, text=True, timeout=300
        )
    finally:
        other.stop()
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stdout + done.stderr
    assert lines[-1].startswith("error: --teacher http://127.0.0.1:") and "another tokenizer" in lines[-1]
    assert token not in done.stdout + done.stderr


def test_teacher_logprobs_are_stored_in_the_pool_and_not_scored_again_after_a_restart(
    tmp_path: Path, teacher_model: Any, tokenizer: Any, student_engine: HFEngine
) -> None:
    from swarm.pool import Pool

    vllm, live, _ = vllm_teacher_student(tmp_path, teacher_model, tokenizer, student_engine)
    try:
        with SwarmClient(live.url) as client:
            first = rollout(client, "t1", 1.0)
            wait_for(lambda: len(vllm.requests) == 1, what="the first episode scored")
            wait_for(lambda: client.get_episode(first).calls[0].teacher_logprobs is not None, what="stored")
        live.restart()  # a new process would read the same pool
        with SwarmClient(live.url) as client:
            second = rollout(client, "t1", 0.0)
            wait_for(lambda: client.status().step == 1, what="step 1")
    finally:
        live.stop()
        vllm.stop()
    assert len(vllm.requests) == 2  # one call each: the first episode was not scored again
    pool = Pool(tmp_path / "run" / "pool.db")
    try:
        for eid in (first, second):
            found = pool.get(eid)
            assert found is not None and found[0].trained_step == 1
            assert all(c.teacher_logprobs for c in found[1])
    finally:
        pool.close()


def _scoring_server(tmp_path: Path, engine: HFEngine, limits: Limits | None = None) -> tuple[Any, str, str]:
    """A non-training server with an admin token and one client token named ``lab``: (server, admin, client)."""
    admin, client = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    live = make_server(
        tmp_path,
        engine,
        training=TrainingConfig(enabled=False),
        admin_token=SecretStr(admin),
        client_tokens={"lab": SecretStr(client)},
        limits=limits or Limits(),
    )
    return live, admin, client


def test_the_score_route_takes_a_client_or_admin_token_never_an_episode_key(
    tmp_path: Path, tiny_engine: HFEngine
) -> None:
    live, admin, client = _scoring_server(tmp_path, tiny_engine)
    body = {"token_ids": [1, 2, 3], "start": 1}
    try:
        begun = httpx.post(
            f"{live.url}/api/v1/episodes",
            json={"task_id": "t"},
            headers={"Authorization": f"Bearer {client}"},
        )
        key = begun.json()["api_key"]
        answers = {
            who: httpx.post(
                f"{live.url}/v1/score", json=body, headers={"Authorization": f"Bearer {secret}"}
            ).status_code
            for who, secret in (("admin", admin), ("client", client), ("episode key", key))
        }
        answers["none"] = httpx.post(f"{live.url}/v1/score", json=body).status_code
    finally:
        live.stop()
    assert answers == {"admin": 200, "client": 200, "episode key": 403, "none": 401}


def test_a_client_tokens_scoring_and_tokenizing_count_against_its_request_rate(
    tmp_path: Path, tiny_engine: HFEngine
) -> None:
    """fresh35 F6: /v1/score and /tokenize had no rate limit. A client token's calls count against its
    ``requests_per_s_per_token`` as begins and chat calls do (429 + Retry-After); the admin's do not."""
    # a bucket of one request, refilled in 100 s
    live, admin, client = _scoring_server(tmp_path, tiny_engine, Limits(requests_per_s_per_token=0.01))
    try:
        as_client = {"Authorization": f"Bearer {client}"}
        first = httpx.post(f"{live.url}/tokenize", json={"prompt": "hello"}, headers=as_client)
        score = {"token_ids": [1, 2, 3], "start": 1}
        second = httpx.post(f"{live.url}/v1/score", json=score, headers=as_client)
        admin_calls = [
            httpx.post(
                f"{live.url}/tokenize", json={"prompt": "hi"}, headers={"Authorization": f"Bearer {admin}"}
            )
            for _ in range(3)
        ]
    finally:
        live.stop()
    assert first.status_code == 200, first.text
    assert second.status_code == 429 and int(second.headers["retry-after"]) >= 1, second.text
    assert "client token 'lab' is over its 0.01 requests/s" in second.json()["error"]["message"]
    assert [r.status_code for r in admin_calls] == [200, 200, 200]


def unscored_events(run_dir: Path) -> dict[str, str]:
    """episode id → message of its latest ``distill.unscored`` event."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return {}
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return {e["data"]["episode_id"]: e["message"] for e in events if e["kind"] == "distill.unscored"}


def test_impossible_teacher_logprobs_are_refused_like_an_outage(
    tmp_path: Path, teacher_model: Any, tokenizer: Any, student_engine: HFEngine
) -> None:
    from typer.testing import CliRunner

    from swarm.cli import app

    vllm, live, token = vllm_teacher_student(
        tmp_path,
        teacher_model,
        tokenizer,
        student_engine,
        wait_s=1.0,
        retry_after_s=60.0,
        attempts=2,
        timeout_s=5.0,
    )
    broken: dict[str, str] = {}
    try:
        with SwarmClient(live.url) as client:
            # log-probabilities above 0, NaN, -inf: no distribution has them; each episode stays unscored
            for distort, shown in [
                (lambda x: x + 50.0, "impossible logprob"),
                (lambda x: math.nan, "nan"),
                (lambda x: -math.inf, "-inf"),
            ]:
                vllm.distort = distort
                eid = rollout(client, "t1", 1.0)
                wait_for(lambda eid=eid: eid in unscored_events(tmp_path / "run"), what="distill.unscored")
                broken[eid] = shown
            status = client.status()
            assert status.step == 0  # nothing trained on the impossible values
            assert status.distill is not None and status.distill.unscored_episodes == 3
            assert not status.distill.teacher_ok and status.distill.last_failure_at is not None
            shown_by_cli = CliRunner().invoke(app, ["status", live.url], env={"COLUMNS": "200"})
            assert shown_by_cli.exit_code == 0, shown_by_cli.output
            assert "episodes unscored" in shown_by_cli.output and "failing" in shown_by_cli.output
            for eid, shown in broken.items():
                message = unscored_events(tmp_path / "run")[eid]
                assert shown in message and "kept out of training" in message
                view = client.get_episode(eid)
                assert view.trained_step is None and all(c.teacher_logprobs is None for c in view.calls)
            vllm.distort = None  # the teacher is sane again: everything is scored and trains
            last = rollout(client, "t1", 0.0)
            wait_for(lambda: client.status().step >= 1, what="step 1")
            wait_for(
                lambda: all(client.get_episode(e).trained_step for e in [*broken, last]), what="all trained"
            )
            rows = httpx.get(f"{live.url}/api/v1/metrics").json()
            status = client.status()
            assert status.distill is not None and status.distill.teacher_ok
            assert status.distill.unscored_episodes == 0
    finally:
        live.stop()
        vllm.stop()
    for row in rows:
        assert math.isfinite(row["distill"]["teacher_kl"]) and abs(row["distill"]["teacher_kl"]) < 20
    assert token not in (tmp_path / "run" / "events.jsonl").read_text()


def test_a_scoring_failure_that_is_no_teacher_error_is_reported_and_counted(
    tmp_path: Path,
    teacher: LiveServer,
    student_engine: HFEngine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: Any,
) -> None:
    from swarm.pool import Pool

    real = Pool.set_teacher_logprobs
    failing = {"on": True}

    def store(self: Pool, episode_id: str, scored: dict[int, list[float]]) -> None:
        if failing["on"]:
            raise OSError("disk full")  # the pool's store fails: not a TeacherError
        real(self, episode_id, scored)

    monkeypatch.setattr(Pool, "set_teacher_logprobs", store)
    config = distill_config(teacher.url, wait_s=1.0, retry_after_s=0.5)
    live = make_server(tmp_path, student_engine, training=config)
    try:
        with SwarmClient(live.url) as client, caplog.at_level("WARNING", "swarm.server.teacher_scoring"):
            ids = [rollout(client, "t1", 1.0), rollout(client, "t1", 0.0)]  # one group: a batch
            wait_for(lambda: set(ids) <= unscored_events(tmp_path / "run").keys(), what="distill.unscored")
            assert all("OSError: disk full" in unscored_events(tmp_path / "run")[e] for e in ids)
            assert any("disk full" in r.getMessage() for r in caplog.records)
            assert client.status().step == 0
            failing["on"] = False  # the store works again: the episodes are scored on a retry and train
            wait_for(lambda: all(client.get_episode(e).trained_step == 1 for e in ids), what="step 1")
            row = httpx.get(f"{live.url}/api/v1/metrics").json()[0]
    finally:
        live.stop()
    assert row["episodes"] == 2
