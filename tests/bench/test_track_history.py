"""The tracking history: the regression rule on synthetic histories, and recording in a real SQLite store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from track_history import (
    STUDY_KIND,
    HistoryFileError,
    Status,
    export_history,
    import_history,
    judge,
    load_history,
    record_run,
)

from memory import RunStatus, Store, StudyExport

COMMIT_A, COMMIT_B, COMMIT_C = "a" * 40, "b" * 40, "c" * 40
MACHINE = {"cpu": "Test CPU", "cores": 2}


def _config(
    mode: str = "quick", cpu: str = "Test CPU", calls: int = 12, load_avg_1m: float = 1.0, **other: Any
) -> dict[str, Any]:
    return {
        "mode": mode,
        "load_avg_1m": load_avg_1m,
        "settings": {"threads": 2, "merge_calls": calls, "update_seqs": 8, **other},
        "dirty": False,
        "provenance": {"versions": {"torch": "2.13.0"}, "machine": {**MACHINE, "cpu": cpu}},
        "backend": {"engine": "hf", "trainer": "torch", "device": "cpu"},
    }


# -- the rule --------------------------------------------------------------------------------------------
def test_a_drop_beyond_the_band_in_the_bad_direction_is_a_regression() -> None:
    history = [1.00, 1.02, 0.98, 1.01]
    v = judge("learning", "reward_last", [0.80], history, higher_is_better=True, history_commits=2)
    assert v.status is Status.regression
    assert v.history_runs == 4 and v.history_commits == 2
    assert v.relative_change == pytest.approx(0.80 / 1.0025 - 1)
    assert (
        judge("learning", "reward_last", [1.20], history, higher_is_better=True).status is Status.improvement
    )
    assert judge("learning", "reward_last", [1.01], history, higher_is_better=True).status is Status.ok


def test_lower_is_better_flips_the_direction() -> None:
    history = [2.0, 2.1, 1.9]
    assert judge("update", "step_s", [3.0], history, higher_is_better=False).status is Status.regression
    assert judge("update", "step_s", [1.0], history, higher_is_better=False).status is Status.improvement


def test_the_new_value_is_the_median_of_the_seeds() -> None:
    history = [1.0, 1.0, 1.01, 0.99]
    v = judge("learning", "reward_last", [0.2, 1.0, 1.0], history, higher_is_better=True)
    assert v.candidate == 1.0 and v.status is Status.ok  # one bad seed does not flag
    v = judge("learning", "reward_last", [0.2, 0.3, 1.0], history, higher_is_better=True)
    assert v.candidate == 0.3 and v.status is Status.regression


def test_a_noisy_history_widens_the_band() -> None:
    history = [100.0, 140.0, 70.0, 120.0, 90.0]  # σ ≈ 27
    v = judge("throughput", "tokens_per_s", [60.0], history, higher_is_better=True, k=3.0)
    assert v.status is Status.ok  # −42 % but within 3σ of a noisy machine
    assert judge("throughput", "tokens_per_s", [60.0], history, higher_is_better=True, k=1.0).status is (
        Status.regression
    )


def test_a_deterministic_metric_needs_the_minimum_relative_change() -> None:
    history = [9.29, 9.29, 9.29]  # σ = 0
    assert judge(
        "merge", "tokens_ratio", [9.28], history, higher_is_better=True, min_relative=0.01
    ).status is (Status.ok)
    assert judge(
        "merge", "tokens_ratio", [8.0], history, higher_is_better=True, min_relative=0.01
    ).status is (Status.regression)
    assert judge(
        "merge", "tokens_ratio", [9.29], history, higher_is_better=True, min_relative=0.0
    ).status is (Status.ok)


def test_too_little_history_gives_no_verdict() -> None:
    v = judge("merge", "tokens_ratio", [1.0], [5.0, 5.0], higher_is_better=True)
    assert v.status is Status.no_history and v.history_runs == 2
    assert judge("merge", "tokens_ratio", [1.0], [5.0, 5.0], higher_is_better=True, min_history=2).status is (
        Status.regression
    )
    with pytest.raises(ValueError, match="at least one new value"):
        judge("merge", "tokens_ratio", [], [1.0], higher_is_better=True)


# -- the store -------------------------------------------------------------------------------------------
def _record(store: Store, commit: str, seed: int, value: float, **config: Any) -> int:
    return record_run(
        store,
        benchmark="merge",
        description="tokens ratio",
        seed=seed,
        git_commit=commit,
        config=_config(**config),
        steps=[{"tokens_ratio": value - 0.5}, {"tokens_ratio": value}],
        final={"tokens_ratio": value},
    )


def test_runs_are_recorded_per_commit_and_seed_with_steps_and_finals(tmp_path: Path) -> None:
    with Store(tmp_path / "track.db") as store:
        ids = [_record(store, COMMIT_A, seed, 9.0 + seed / 100) for seed in range(3)]
        failed = record_run(
            store,
            benchmark="merge",
            description="tokens ratio",
            seed=3,
            git_commit=COMMIT_A,
            config=_config(),
            steps=[],
            final=None,
            error="RuntimeError: boom",
        )
        studies = [s for s in store.studies() if s.kind == STUDY_KIND]
        assert len(studies) == 1
        assert [e.name for e in store.experiments(studies[0].id)] == ["merge"]
        run = store.get_run(ids[1])
        assert run.git_commit == COMMIT_A and run.seed == 1 and run.status is RunStatus.finished
        assert run.config["provenance"]["machine"]["cores"] == 2 and run.config["mode"] == "quick"
        assert run.final_metrics == {"tokens_ratio": 9.01}
        assert [(p.step, p.value) for p in store.metric_history(ids[1], "tokens_ratio")] == [
            (1, 8.51),
            (2, 9.01),
        ]
        assert store.get_run(failed).status is RunStatus.failed
        assert store.get_run(failed).error == "RuntimeError: boom"
        history = load_history(store)
        assert [r.run.id for r in history.runs["merge"]] == ids  # the failed run is not history
        assert history.commits() == [COMMIT_A]


def test_the_verdict_compares_with_earlier_commits_of_the_same_mode_sizes_and_machine(tmp_path: Path) -> None:
    with Store(tmp_path / "track.db") as store:
        for seed in range(2):
            _record(store, COMMIT_A, seed, 9.3)
        _record(store, COMMIT_B, 0, 9.3, update_seqs=4, spy_games=6)  # another benchmark's sizes: in it
        _record(store, COMMIT_B, 0, 1.0, mode="full")  # another mode: not in the band
        _record(store, COMMIT_B, 0, 1.0, cpu="Other CPU")  # another machine: not in the band
        _record(store, COMMIT_B, 0, 1.0, calls=3)  # other sizes of this benchmark: not in the band
        _record(store, COMMIT_B, 0, 1.0, threads=1)  # other torch threads: not in the band
        new = [_record(store, COMMIT_C, seed, 7.0) for seed in range(3)]
        history = load_history(store)
        v = history.verdict("merge", "tokens_ratio", new, higher_is_better=True, k=3.0, min_relative=0.01)
        assert v.status is Status.regression
        assert v.history_runs == 3 and v.history_commits == 2 and v.baseline_mean == pytest.approx(9.3)
        assert v.new == (7.0, 7.0, 7.0)
        # The same commit's earlier runs are not its own baseline.
        again = _record(store, COMMIT_C, 3, 7.0)
        v = load_history(store).verdict(
            "merge", "tokens_ratio", [again], higher_is_better=True, k=3.0, min_relative=0.01
        )
        assert v.history_commits == 2 and v.status is Status.regression
        with pytest.raises(ValueError, match="no finished run"):
            history.verdict("merge", "missing", new, higher_is_better=True, k=3.0, min_relative=0.01)


def test_an_imported_history_and_local_runs_read_as_one_history(tmp_path: Path) -> None:
    """A store with a local tracking study imports an exported one: both are read, oldest run first,
    and runs recorded with ``study_id`` go to the imported study, which exports with them."""
    with Store(tmp_path / "elsewhere.db") as other:
        old = [_record(other, COMMIT_A, seed, 9.0) for seed in range(3)]
        export_history(other, other.studies()[0].id, tmp_path / "track.json")
        assert len(old) == 3
    with Store(tmp_path / "track.db") as store:
        _record(store, COMMIT_C, 0, 9.2)  # recorded here before the import, started later than COMMIT_A's
        imported = import_history(store, tmp_path / "track.json")
        assert import_history(store, tmp_path / "track.json") == imported  # idempotent
        assert len([s for s in store.studies() if s.kind == STUDY_KIND]) == 2
        recorded = record_run(
            store, benchmark="merge", description="tokens ratio", seed=0, git_commit=COMMIT_B,
            config=_config(), steps=[], final={"tokens_ratio": 9.1}, study_id=imported,
        )  # fmt: skip
        history = load_history(store)
        assert history.commits() == [COMMIT_A, COMMIT_C, COMMIT_B]
        assert len(history.runs["merge"]) == 5
        assert store.get_run(recorded).experiment_id in {e.id for e in store.experiments(imported)}
        export_history(store, imported, tmp_path / "newer.json")
    newer = StudyExport.model_validate_json((tmp_path / "newer.json").read_text())
    assert [r.git_commit for r in newer.experiments[0].runs] == [COMMIT_A] * 3 + [COMMIT_B]


def test_a_history_file_of_another_kind_or_not_an_export_is_refused(tmp_path: Path) -> None:
    with Store(tmp_path / "research.db") as store:
        store.create_study("a research question")
        (tmp_path / "research.json").write_text(store.export_study(1).model_dump_json())
        with pytest.raises(HistoryFileError, match="kind 'research', not a tracking history"):
            import_history(store, tmp_path / "research.json")
        with pytest.raises(HistoryFileError, match=r"missing\.json: No such file"):
            import_history(store, tmp_path / "missing.json")


def test_a_timing_measured_at_a_very_different_load_is_not_comparable(tmp_path: Path) -> None:
    """Found on the dashboard: "+3096.9 % improvement" in throughput compared runs at load 8–9 with one
    at 1.3. A load-sensitive metric beyond the band at > 2× the history's load per core is not judged."""
    with Store(tmp_path / "track.db") as store:
        for commit, seed in ((COMMIT_A, 0), (COMMIT_A, 1), (COMMIT_B, 0)):
            _record(store, commit, seed, 9.3, load_avg_1m=8.5)
        fast = [_record(store, COMMIT_C, 0, 30.0, load_avg_1m=1.3)]
        history = load_history(store)
        judged = {"higher_is_better": True, "k": 3.0, "min_relative": 0.01}
        assert history.verdict("merge", "tokens_ratio", fast, **judged).status is Status.improvement
        loaded = history.verdict("merge", "tokens_ratio", fast, load_sensitive=True, **judged)
        assert loaded.status is Status.not_comparable and loaded.status.value == "not comparable (load)"
        same_load = [_record(store, COMMIT_C, 1, 30.0, load_avg_1m=7.0)]
        v = load_history(store).verdict("merge", "tokens_ratio", same_load, load_sensitive=True, **judged)
        assert v.status is Status.improvement  # 7.0 vs 8.5: comparable
