"""The analyst patches rewards: a part of the reward exploited in a finished run is found past the
noise, the offline rules write a reward patch for the spy and countdown rewards, and training continues
on the patched reward (its continuation trains as many steps again)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from langgraph.runtime import Runtime

import templates
from a3r.graph import RunContext, RunOutcome
from a3r.graph.analyst import analyst, continuation
from a3r.graph.context import Ledger
from a3r.providers import OfflineProvider, read_params
from a3r.study.analysis import Diagnosis, DiagnosisKind, detect_part_exploits, part_roles
from a3r.study.runs import RunSpec
from memory import ArtifactKind, Store

SPY = part_roles("who_is_the_spy")
COUNTDOWN = part_roles("countdown")


def _rising(rng: random.Random, start: float, step: float, n: int = 12, sd: float = 0.03) -> list[float]:
    return [start + step * t + rng.gauss(0.0, sd) for t in range(n)]


def test_a_rising_violation_is_an_exploit_and_noise_is_not() -> None:
    rng = random.Random(7)
    assert SPY == {"win_rate": "goal", "leak_rate": "violation", "invalid_vote_rate": "violation"}
    parts = {
        "win_rate": _rising(rng, 0.4, 0.03),
        "leak_rate": _rising(rng, 0.1, 0.05),
        "invalid_vote_rate": [0.2 + rng.gauss(0.0, 0.05) for _ in range(10)],
    }
    (found,) = detect_part_exploits(parts, SPY)
    assert found.kind is DiagnosisKind.reward_hacking and found.patchable
    assert found.evidence["part"] == "leak_rate" and found.evidence["role"] == "violation"
    assert float(found.evidence["low"]) > 0 and "leak_rate (violation) rose" in found.summary
    noise = {name: [0.3 + rng.gauss(0.0, 0.1) for _ in range(10)] for name in SPY}
    assert detect_part_exploits(noise, SPY) == []
    assert detect_part_exploits({"leak_rate": [0.1, 0.9]}, SPY) == []  # two points settle nothing


def test_a_shaping_bonus_counts_only_while_the_goal_stalls() -> None:
    rng = random.Random(3)
    formats = _rising(rng, 0.2, 0.07)
    (found,) = detect_part_exploits({"format_ok": formats, "correct": [0.05] * 10}, COUNTDOWN)
    assert found.evidence["part"] == "format_ok" and found.evidence["role"] == "shaping"
    both = {"format_ok": formats, "correct": _rising(rng, 0.05, 0.04)}
    assert detect_part_exploits(both, COUNTDOWN) == []
    # math pays only a verified answer: its format part is never an exploit
    assert detect_part_exploits({"format_ok": formats, "correct": [0.1] * 10}, part_roles("math")) == []


def _workflow(template: str, params: dict[str, object], tmp_path: Path) -> str:
    rendered = templates.render(template, {**params, "n_tasks": 4}, tmp_path / template)
    return (rendered.folder / "workflow.py").read_text()


def _hack(part: str, role: str) -> Diagnosis:
    return Diagnosis(
        kind=DiagnosisKind.reward_hacking,
        summary=f"{part} ({role}) rose",
        evidence={"part": part, "role": role},
        patchable=True,
    )


@pytest.mark.parametrize(
    ("template", "params", "diagnosis", "expected"),
    [
        ("who_is_the_spy", {"leak_penalty": 0.0}, _hack("leak_rate", "violation"), {"leak_penalty": 0.5}),
        ("who_is_the_spy", {"leak_penalty": 0.5}, _hack("leak_rate", "violation"), {"leak_penalty": 1.0}),
        (
            "who_is_the_spy",
            {"invalid_vote_penalty": 0.1},
            _hack("invalid_vote_rate", "violation"),
            {"invalid_vote_penalty": 0.25, "leak_penalty": 0.5},
        ),
        (
            "who_is_the_spy",
            {"leak_penalty": 0.1, "invalid_vote_penalty": 0.0},
            Diagnosis(kind=DiagnosisKind.reward_hacking, summary="train up, held-out down", patchable=True),
            {"leak_penalty": 0.5, "invalid_vote_penalty": 0.25},
        ),
        ("countdown", {}, _hack("format_ok", "shaping"), {"format_reward": 0.0}),
    ],
)
def test_offline_reward_patches(
    tmp_path: Path, template: str, params: dict[str, object], diagnosis: Diagnosis, expected: dict[str, float]
) -> None:
    workflow = _workflow(template, params, tmp_path)
    draft = OfflineProvider().propose_patch(diagnosis, {"workflow.py": workflow}, template=template)
    assert draft is not None and draft.file == "workflow.py" and "Reward patch:" in draft.rationale
    patched = read_params(draft.new_content)
    assert {k: patched[k] for k in expected} == expected
    unchanged = {k: v for k, v in read_params(workflow).items() if k not in expected}
    assert {k: patched[k] for k in unchanged} == unchanged


def test_no_reward_patch_where_the_reward_cannot_be_exploited(tmp_path: Path) -> None:
    provider = OfflineProvider()
    math_workflow = _workflow("arithmetic", {}, tmp_path)
    hack = Diagnosis(kind=DiagnosisKind.reward_hacking, summary="held-out fell", patchable=True)
    assert provider.propose_patch(hack, {"workflow.py": math_workflow}, template="arithmetic") is None
    spy = _workflow("who_is_the_spy", {"leak_penalty": 1.0, "invalid_vote_penalty": 1.0}, tmp_path)
    assert (
        provider.propose_patch(
            _hack("leak_rate", "violation"), {"workflow.py": spy}, template="who_is_the_spy"
        )
        is None
    )


def test_a_finished_run_with_an_exploited_part_gets_a_reward_patch_and_continues(tmp_path: Path) -> None:
    store = Store(tmp_path / "memory.db")
    plan = OfflineProvider().plan("train who-is-the-spy", mode="vibe")
    study = store.create_study("train who-is-the-spy", kind="vibe")
    run = store.start_run(store.create_experiment(study.id, "spy-train").id, name="train-s0")
    ws = tmp_path / "ws"
    ws.mkdir()
    workflow = _workflow("who_is_the_spy", {"leak_penalty": 0.0}, tmp_path)  # a broken reward
    (ws / "workflow.py").write_text(workflow)
    store.add_artifact(study.id, ArtifactKind.workflow, "workflow.py", workflow)
    rng = random.Random(1)
    outcome = RunOutcome(
        key="train-s0",
        run_id=run.id,
        purpose="train",
        status="finished",
        reason="reached step 10",
        steps=10,
        curve=[(t + 1, 0.1 + 0.02 * t) for t in range(10)],
        parts={"win_rate": [0.5] * 12, "leak_rate": _rising(rng, 0.05, 0.06, sd=0.01)},
    )
    state = {
        "mode": "vibe",
        "study_id": study.id,
        "workspace": str(ws),
        "plan": plan,
        "outcomes": [outcome],
        "queue": [],
        "hypothesis_ids": [],
    }
    ctx = RunContext(
        store=store,
        provider=OfflineProvider(),
        ledger=Ledger(tmp_path / "l.db"),
        thread_id="t",
        root=tmp_path,
    )
    command = analyst(state, Runtime(context=ctx))  # type: ignore[arg-type]
    assert command.goto == "approve"
    review = command.update["pending_patch"]  # type: ignore[index]
    assert (
        review.file == "workflow.py"
        and "'leak_penalty': 0.5" in review.diff
        and "leak_rate" in review.rationale
    )
    (finding,) = [f for f in store.findings(study.id) if "leak_rate" in f.statement]
    assert finding.status.value == "confirmed"
    follow = continuation(
        outcome,
        RunSpec(key="train-s0", purpose="train", settings=plan.training),
        suffix="p1",
        early_stop=False,
    )
    assert follow.start_step == 10 and follow.settings.steps == 10 + plan.training.steps
    store.close()
