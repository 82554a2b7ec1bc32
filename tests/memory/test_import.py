"""`Store.import_study`, the inverse of `Store.export_study`, on SQLite and on PostgreSQL (fixture ``store``)."""

from __future__ import annotations

from typing import Any

import pytest

from memory import InvalidInput, Store, StudyExport


def _populated(store: Store) -> int:
    """A study using every kind of record: hypothesis, experiment, runs with points, artifacts, patches,
    a finding with evidence runs, and study and run events."""
    study = store.create_study("Does a KL penalty prevent collapse on countdown?", kind="research")
    hypothesis = store.register_hypothesis(
        study.id, statement="KL helps", expected_outcome="no collapse", decision_rule="3 of 3 seeds"
    )
    experiment = store.create_experiment(
        study.id, "kl-0.05", description="KL 0.05", template="countdown", hypothesis_id=hypothesis.id
    )
    control = store.create_experiment(study.id, "control")
    good = store.start_run(experiment.id, name="s0", seed=0, config={"kl_coef": 0.05}, git_commit="a" * 40)
    for step in (1, 2, 3):
        store.log_metrics(good.id, step, {"reward/mean": step / 10, "kl": 0.01 * step})
    store.log_metrics(good.id, 3, {"reward/mean": 0.35})  # a second point at one step keeps its order
    store.finish_run(good.id, final_metrics={"accuracy": 0.5})
    bad = store.start_run(control.id, name="c0", seed=1)
    store.log_metrics(bad.id, 1, {"reward/mean": 0.0})
    store.finish_run(bad.id, status="failed", error="CUDA out of memory")
    store.start_run(control.id, name="c1", seed=2)  # still running
    v1 = store.add_artifact(study.id, "reward", "reward.py", "def reward(): return 0\n")
    applied = store.propose_patch(v1.id, diff="-0\n+1", rationale="reward is constant")
    store.decide_patch(applied.id, approve=True, by="human", note="ok")
    store.mark_patch_applied(applied.id, content="def reward(): return 1\n")
    rejected = store.propose_patch(v1.id, diff="-0\n+2", rationale="why not")
    store.decide_patch(rejected.id, approve=False, by="human")
    store.add_finding(
        study.id, statement="KL helps a bit", confidence=0.55, run_ids=[good.id, bad.id], seeds=[0, 1],
        hypothesis_id=hypothesis.id,
    )  # fmt: skip
    store.log_event("planner: starting", study_id=study.id)
    store.log_event("collapse detected", run_id=bad.id, level="error")
    return study.id


def _canonical(export: StudyExport) -> dict[str, Any]:
    """The export as JSON with every id replaced by the record's position (ids differ between stores)."""
    data = export.model_dump(mode="json", exclude={"exported_at"})
    del data["study"]["id"]
    runs = [run for experiment in data["experiments"] for run in experiment["runs"]]
    index = {
        "hypothesis_id": {h["id"]: i for i, h in enumerate(data["hypotheses"])},
        "experiment_id": {e["id"]: i for i, e in enumerate(data["experiments"])},
        "run_id": {r["id"]: i for i, r in enumerate(runs)},
        "artifact_id": {a["id"]: i for i, a in enumerate(data["artifacts"])},
    }
    index["result_artifact_id"] = index["artifact_id"]
    own = {"hypotheses": "hypothesis_id", "experiments": "experiment_id", "artifacts": "artifact_id"}
    records = [*data["hypotheses"], *data["experiments"], *runs, *data["artifacts"], *data["patches"]]
    records += [*data["findings"], *data["events"]]
    for kind, key in own.items():
        for record in data[kind]:
            record["id"] = index[key][record["id"]]
    for record in runs:
        record["id"] = index["run_id"][record["id"]]
    for record in records:
        record.pop("study_id", None)
        for key, ids in index.items():
            if record.get(key) is not None:
                record[key] = ids[record[key]]
        if "run_ids" in record:
            record["run_ids"] = [index["run_id"][r] for r in record["run_ids"]]
    for record in [*data["patches"], *data["findings"], *data["events"]]:
        del record["id"]
    return data


def _renamed(export: StudyExport, question: str) -> StudyExport:
    """The same export under another key, so that it imports as a new study into the same store."""
    return export.model_copy(update={"study": export.study.model_copy(update={"question": question})})


def test_an_imported_export_is_the_same_study_with_new_ids(store: Store) -> None:
    original = store.export_study(_populated(store))
    (run,) = original.experiments[0].runs
    assert [(p.step, p.name, p.value) for p in run.metric_points][-3:] == [
        (3, "reward/mean", 0.3),
        (3, "kl", 0.03),
        (3, "reward/mean", 0.35),
    ]
    text = original.model_dump_json()
    copy_id = store.import_study(_renamed(StudyExport.model_validate_json(text), "copy"))
    assert copy_id != original.study.id
    copy = store.export_study(copy_id)
    assert copy.study.question == "copy"
    expected = _canonical(original)
    expected["study"]["question"] = "copy"
    assert _canonical(copy) == expected
    # The curves and the latest values are those of the copy's own points.
    new_run = copy.experiments[0].runs[0]
    assert new_run.id != run.id and new_run.latest_metrics == {"reward/mean": 0.35, "kl": 0.03}
    assert [p.value for p in store.metric_history(new_run.id, "reward/mean")] == [0.1, 0.2, 0.3, 0.35]


def test_a_reimport_is_idempotent_and_adds_only_the_new_runs(store: Store) -> None:
    study_id = _populated(store)
    first = store.export_study(study_id)
    assert store.import_study(first) == study_id  # same key: nothing duplicated
    assert _canonical(store.export_study(study_id)) == _canonical(first)

    copy_id = store.import_study(_renamed(first, "copy"))
    experiment_id = first.experiments[0].id
    newer = store.start_run(experiment_id, name="s1", seed=1)
    store.log_metrics(newer.id, 1, {"reward/mean": 0.4})
    store.finish_run(newer.id, final_metrics={"accuracy": 0.6})
    store.log_event("seed 1 done", run_id=newer.id)
    second = _renamed(store.export_study(study_id), "copy")

    assert store.import_study(second) == copy_id
    assert store.import_study(second) == copy_id
    merged = store.export_study(copy_id)
    assert [r.name for r in merged.experiments[0].runs] == ["s0", "s1"]
    assert _canonical(merged) == _canonical(second)
    assert len(store.studies()) == 2


def test_an_export_referencing_a_missing_run_is_refused_and_writes_nothing(store: Store) -> None:
    export = store.export_study(_populated(store))
    broken = _renamed(export, "broken")
    broken.findings[0].run_ids.append(9999)
    with pytest.raises(InvalidInput, match="run 9999"):
        store.import_study(broken)
    assert [s.question for s in store.studies()] == [export.study.question]
