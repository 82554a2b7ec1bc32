"""Detectors and statistics over run records (pure functions; formulas checked against naive forms)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from a3r.study.analysis import (
    DiagnosisKind,
    EpisodeRecord,
    detect_all,
    detect_collapse,
    detect_crash,
    detect_length_collapse,
    detect_reward_hacking,
    detect_stall,
    detect_zero_signal,
    groups_of,
    mean_ci,
    part_curves,
    pass_at_k,
    read_progress,
    step_parts,
    summarise_rewards,
    trained_count,
)


@pytest.mark.parametrize(
    ("n", "c", "k"), [(n, c, k) for n in range(1, 7) for c in range(n + 1) for k in range(1, n + 1)]
)
def test_pass_at_k_matches_enumeration(n: int, c: int, k: int) -> None:
    attempts = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    naive = sum(1 for s in subsets if any(attempts[i] for i in s)) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(naive)


def test_pass_at_k_rejects_bad_counts() -> None:
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_summary_and_ci() -> None:
    summary = summarise_rewards({"a": [1.0, 0.0], "b": [0.0, 0.0], "c": [1.0, 1.0]})
    assert summary.tasks == 3 and summary.episodes == 6
    assert summary.mean_reward == pytest.approx(0.5)
    assert summary.pass_at_1 == pytest.approx((0.5 + 0 + 1) / 3)
    assert summary.pass_at_2 == pytest.approx((1 + 0 + 1) / 3)
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(1.96 * 1.0 / math.sqrt(3))
    assert math.isnan(mean_ci([1.0])[1])


def test_read_progress_skips_torn_lines(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    rows = [
        {"kind": "train", "round": 0, "task_id": "t1", "member": 0, "status": "finished", "reward": 1.0},
        {"kind": "train", "round": 0, "task_id": "t1", "member": 1, "status": "finished", "reward": 0.0},
        {"kind": "train", "round": 0, "task_id": "t2", "member": 0, "status": "aborted", "reward": None},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "tr', encoding="utf-8")
    records = read_progress(path)
    assert len(records) == 3
    assert groups_of(records) == {(0, "t1"): [1.0, 0.0]}
    assert read_progress(tmp_path / "missing.jsonl") == []


def test_zero_signal_needs_full_flat_groups() -> None:
    flat = {(0, f"t{i}"): [0.0, 0.0] for i in range(4)}
    (found,) = detect_zero_signal(flat, group_size=2)
    assert found.kind is DiagnosisKind.zero_signal and found.evidence["all_zero_groups"] == 4
    assert "every attempt fails" in found.summary
    mixed = {**flat, (0, "t9"): [1.0, 0.0], (0, "t8"): [0.0, 1.0]}
    assert detect_zero_signal(mixed, group_size=2) == []  # 4/6 < 0.8
    assert detect_zero_signal({(0, "t"): [1.0, 1.0]}, group_size=2) == []  # too few groups
    assert detect_zero_signal({(0, "t"): [0.0], (0, "u"): [0.0]}, group_size=2) == []  # groups not full
    easy = {(0, f"t{i}"): [1.0, 1.0] for i in range(3)}
    assert "same positive reward" in detect_zero_signal(easy, group_size=2)[0].summary


def test_collapse_and_length() -> None:
    rows = [
        {"step": s, "reward_mean": r, "entropy": e}
        for s, r, e in [(1, 0.6, 1.0), (2, 0.6, 0.8), (3, 0.1, 0.3), (4, 0.1, 0.01)]
    ]
    kinds = [d.summary for d in detect_collapse(rows)]
    assert any("fell from 0.600" in k for k in kinds) and any("entropy collapsed" in k for k in kinds)
    steady = [{"step": s, "reward_mean": 0.5, "entropy": 1.0, "kl": 0.01} for s in range(1, 7)]
    assert detect_collapse(steady) == []
    assert detect_collapse([{"step": 1, "kl": 3.0}])[0].evidence["kl"] == 3.0
    shrinking = [{"step": s, "completion_tokens_mean": v} for s, v in enumerate([50, 48, 40, 20, 6, 5], 1)]
    assert detect_length_collapse(shrinking)[0].kind is DiagnosisKind.length_collapse
    assert detect_length_collapse(steady) == []


def test_reward_hacking_and_stall() -> None:
    (found,) = detect_reward_hacking([(1, 0.2), (5, 0.6)], [(0, 0.5), (1, 0.3)])
    assert found.kind is DiagnosisKind.reward_hacking and found.evidence["train_gain"] == pytest.approx(0.4)
    assert detect_reward_hacking([(1, 0.2), (5, 0.6)], [(0, 0.3), (1, 0.5)]) == []
    stalled = [(0.0, 3, 10), (100.0, 3, 30), (200.0, 3, 50)]
    assert detect_stall(stalled, window_s=150)[0].evidence["new_episodes"] == 20  # samples in the last 150 s
    moving = [(0.0, 3, 10), (100.0, 4, 30), (200.0, 5, 50)]
    assert detect_stall(moving, window_s=150) == []


def test_crash_cites_the_traceback() -> None:
    log = (
        'starting\nTraceback (most recent call last):\n  File "workflow.py", line 3, in run\n'
        "    1 / 0\nZeroDivisionError: division by zero\nmore output\n"
    )
    (found,) = detect_crash(log, exit_code=1)
    assert "ZeroDivisionError: division by zero" in found.summary
    assert "workflow.py" in str(found.evidence["traceback_tail"])
    assert detect_crash("all good", exit_code=0) == []
    episodes = [EpisodeRecord(kind="train", round=0, task_id="t", member=0, status="aborted")]
    assert detect_all(rows=[], episodes=episodes, group_size=2)[0].evidence["agent_failures"] == 1


def test_reward_part_curves_average_each_metric_per_batch(tmp_path: Path) -> None:
    rows = [
        {"kind": "train", "round": 0, "task_id": f"t{i // 2}", "member": i % 2, "status": "finished",
         "reward": 0.0, "metrics": {"format_ok": float(i >= 2), "correct": float(i >= 4), "chars": 10.0}}
        for i in range(6)
    ]  # fmt: skip
    rows.insert(1, {"kind": "train", "round": 0, "task_id": "x", "member": 0, "status": "aborted"})
    rows.append({"kind": "eval", "round": 0, "task_id": "e", "member": 0, "status": "finished",
                 "reward": 1.0, "metrics": {"format_ok": 1.0}})  # fmt: skip
    path = tmp_path / "progress.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    episodes = read_progress(path)
    assert episodes[0].metrics["format_ok"] == 0.0 and episodes[1].metrics == {}
    curves = part_curves(episodes, ["format_ok", "correct", "missing"], per_point=2)
    assert curves == {"format_ok": [0.0, 1.0, 1.0], "correct": [0.0, 0.0, 1.0]}
    assert part_curves(episodes, ["format_ok"], per_point=4) == {"format_ok": [0.5, 1.0]}  # 2 of 4 count


def test_reward_parts_count_only_the_episodes_a_step_trained() -> None:
    """Found by a fresh user: a 2-step run showed 3 points (19 finished episodes, 16 trained): the
    episodes that finished after the last step took its batch trained nothing. With the steps' batch
    sizes there is one point per step, and the untrained tail is counted apart."""
    finished = [
        EpisodeRecord(kind="train", round=0, task_id=f"t{i // 4}", member=i % 4, status="finished",
                      reward=0.0, metrics={"win_rate": float(i % 2), "leak_rate": float(i >= 8)})
        for i in range(21)
    ]  # fmt: skip
    aborted = EpisodeRecord(kind="train", round=0, task_id="x", member=0, status="aborted")
    episodes = [*finished[:3], aborted, *finished[3:]]
    per_step = [8, 8]  # ServerStepMetrics.episodes + episodes_dropped of steps 1 and 2
    curves = part_curves(episodes, ["win_rate", "leak_rate"], per_point=8, per_step=per_step)
    assert curves == {"win_rate": [0.5, 0.5], "leak_rate": [0.0, 1.0]}  # 2 steps: 2 points
    assert len(part_curves(episodes, ["win_rate"], per_point=8)["win_rate"]) == 3  # B·G chunks: 8, 8, 5
    assert trained_count(per_step, len(finished)) == 16
    assert trained_count([8, 8, 8], 21) == 21  # never more than finished
    assert part_curves(episodes, ["win_rate"], per_point=8, per_step=[]) == {}  # no step: nothing trained


def test_reward_parts_from_the_pool_count_what_each_step_trained(tmp_path: Path) -> None:
    """The pool records the step that consumed each episode: one point per step of the run (steps
    after its start), the untrained tail (no ``trained_step``) and eval episodes left out."""
    from a3r.swarmops.trained import trained_metrics
    from swarm.pool import Pool, StoredEpisode
    from swarm.protocol import EpisodeKind, EpisodeStatus

    pool = Pool(tmp_path / "pool.db")
    for i in range(10):
        kind = EpisodeKind.EVAL if i == 9 else EpisodeKind.TRAIN
        status = EpisodeStatus.ABORTED if i == 8 else EpisodeStatus.FINISHED
        episode = StoredEpisode(id=f"e{i}", task_id=f"t{i // 2}", client_id="c", kind=kind, status=status,
                                created_at=0.0, finished_at=1.0, metrics={"win_rate": float(i % 2 == 0 or i > 3)})  # fmt: skip
        pool.add(episode, [])
    pool.mark_trained(["e0", "e1"], 1)  # the previous run's step
    pool.mark_trained(["e2", "e3"], 2)
    pool.mark_trained(["e4", "e5", "e8"], 3)  # e6, e7 finished after the last batch: untrained
    pool.close()
    trained = trained_metrics(tmp_path, after_step=1)
    assert trained == [
        (2, {"win_rate": 1.0}),
        (2, {"win_rate": 0.0}),
        (3, {"win_rate": 1.0}),
        (3, {"win_rate": 1.0}),
    ]
    assert step_parts(trained, ["win_rate", "missing"]) == {"win_rate": [0.5, 1.0]}
    assert trained_metrics(tmp_path / "none", after_step=0) is None  # no pool: the caller falls back
