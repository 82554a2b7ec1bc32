"""Conformance suite of the store API, run on SQLite and on PostgreSQL (fixture ``store``)."""

from __future__ import annotations

import hashlib
import time

import pytest

from memory import (
    ArtifactKind,
    FindingStatus,
    FindingUpdate,
    InvalidInput,
    InvalidTransition,
    NotFound,
    PatchStatus,
    PreregistrationError,
    RunStatus,
    RunUpdate,
    Store,
    StoreError,
    StudyStatus,
    StudyUpdate,
    render_markdown,
)


def _study_with_run(store: Store, seed: int = 0) -> tuple[int, int, int]:
    study = store.create_study("Does a KL penalty prevent collapse on countdown?")
    experiment = store.create_experiment(study.id, "kl-0.05", template="countdown")
    run = store.start_run(experiment.id, seed=seed, config={"kl_coef": 0.05})
    return study.id, experiment.id, run.id


def test_open_reports_backend_and_head_revision(store: Store, store_url: str) -> None:
    assert store.dialect == store_url.split(":")[0].split("+")[0]
    assert store.schema_revision == "0002"


def test_study_create_get_update_list(store: Store) -> None:
    study = store.create_study("Is GRPO stable at group size 4?", kind="vibe")
    assert (study.kind, study.status, study.conclusion) == ("vibe", StudyStatus.open, None)
    assert study.created_at.tzinfo is not None
    other = store.create_study("Second question")
    assert [s.id for s in store.studies()] == [study.id, other.id]

    updated = store.update_study(
        study.id, StudyUpdate(status=StudyStatus.concluded, conclusion="stable with KL 0.05")
    )
    assert updated.status is StudyStatus.concluded
    assert updated.conclusion == "stable with KL 0.05"
    assert updated.question == study.question  # fields not set are kept
    assert updated.updated_at >= study.updated_at
    assert store.get_study(study.id) == updated


def test_missing_records_raise_not_found_with_context(store: Store) -> None:
    with pytest.raises(NotFound) as caught:
        store.get_study(404)
    assert (caught.value.entity, caught.value.key) == ("study", 404)
    assert isinstance(caught.value, LookupError) and isinstance(caught.value, StoreError)
    for call in (
        lambda: store.get_run(9),
        lambda: store.create_experiment(9, "x"),
        lambda: store.start_run(9),
        lambda: store.log_metrics(9, 0, {"a": 1.0}),
        lambda: store.get_patch(9),
        lambda: store.decide_patch(9, approve=True, by="me"),
        lambda: store.mark_patch_applied(9),
        lambda: store.propose_patch(9, diff="d", rationale="r"),
        lambda: store.add_artifact(9, "reward", "reward.py", "x"),
        lambda: store.log_event("hello", study_id=9),
        lambda: store.study_runs(9),
        lambda: store.export_study(9),
    ):
        with pytest.raises(NotFound):
            call()


def test_invalid_input_is_a_value_error_naming_fields_not_values(store: Store) -> None:
    with pytest.raises(InvalidInput) as caught:
        store.create_study("")
    assert "question" in str(caught.value)
    assert isinstance(caught.value, ValueError)
    study_id, _, run_id = _study_with_run(store)
    with pytest.raises(InvalidInput, match="confidence") as caught:
        store.add_finding(study_id, statement="s", confidence=1.5, evidence="sk-ant-api03-SECRETSECRETSECRET")
    assert "SECRET" not in str(caught.value)
    with pytest.raises(InvalidInput, match="finite"):
        store.log_metrics(run_id, 1, {"loss": float("nan")})
    with pytest.raises(InvalidInput, match="step"):
        store.log_metrics(run_id, -1, {"loss": 1.0})
    with pytest.raises(InvalidInput, match="kind"):
        store.add_artifact(study_id, "evaluator", "x.py", "x")
    with pytest.raises(InvalidInput, match="study_id or a run_id"):
        store.log_event("orphan")
    with pytest.raises(InvalidInput, match="terminal"):
        store.finish_run(run_id, status="running")


def test_hypothesis_is_registered_before_runs(store: Store) -> None:
    study = store.create_study("q")
    experiment = store.create_experiment(study.id, "baseline")
    before = time.time()
    hypothesis = store.register_hypothesis(
        study.id,
        statement="group size 8 beats 4",
        expected_outcome="+3 points held-out accuracy",
        decision_rule="better on 3 of 3 seeds",
        experiment_id=experiment.id,
    )
    assert hypothesis.registered_at.timestamp() >= before - 1
    assert store.experiments(study.id)[0].hypothesis_id == hypothesis.id
    run = store.start_run(experiment.id, seed=1)
    assert run.started_at >= hypothesis.registered_at

    # Once a run started, no hypothesis may be attached to that experiment any more.
    with pytest.raises(PreregistrationError, match="register hypotheses before the runs"):
        store.register_hypothesis(
            study.id, statement="late", expected_outcome="e", decision_rule="d", experiment_id=experiment.id
        )
    with pytest.raises(PreregistrationError):
        store.set_experiment_hypothesis(experiment.id, hypothesis.id)
    # The refused registration left nothing behind.
    assert [h.statement for h in store.hypotheses(study.id)] == ["group size 8 beats 4"]

    fresh = store.create_experiment(study.id, "group-8")
    linked = store.set_experiment_hypothesis(fresh.id, hypothesis.id)
    assert linked.hypothesis_id == hypothesis.id
    assert store.create_experiment(study.id, "e3", hypothesis_id=hypothesis.id).hypothesis_id == hypothesis.id


def test_hypothesis_and_experiment_must_share_the_study(store: Store) -> None:
    first = store.create_study("one")
    second = store.create_study("two")
    hypothesis = store.register_hypothesis(first.id, statement="s", expected_outcome="e", decision_rule="d")
    with pytest.raises(InvalidInput, match="belongs to study"):
        store.create_experiment(second.id, "x", hypothesis_id=hypothesis.id)
    experiment = store.create_experiment(second.id, "x")
    with pytest.raises(InvalidInput, match="belongs to study"):
        store.register_hypothesis(
            first.id, statement="s", expected_outcome="e", decision_rule="d", experiment_id=experiment.id
        )


def test_run_lifecycle_and_metrics(store: Store) -> None:
    study_id, experiment_id, run_id = _study_with_run(store, seed=7)
    run = store.get_run(run_id)
    assert (run.status, run.seed, run.final_metrics, run.finished_at) == (RunStatus.running, 7, None, None)

    assert store.log_metrics(run_id, 0, {"reward/mean": 0.1, "kl": 0.0}) == 2
    store.log_metrics(run_id, 2, {"reward/mean": 0.5})
    store.log_metrics(run_id, 1, {"reward/mean": 0.3, "kl": 0.02})  # logged late, older step
    history = store.metric_history(run_id, "reward/mean")
    assert [(p.step, p.value) for p in history] == [(0, 0.1), (1, 0.3), (2, 0.5)]
    assert len(store.metric_history(run_id)) == 5

    other = store.start_run(experiment_id, seed=8)
    (first, second) = store.study_runs(study_id)
    assert first.id == run_id and first.study_id == study_id
    assert first.latest_metrics == {"kl": 0.02, "reward/mean": 0.5}
    assert first.latest_step == 2
    assert (second.id, second.latest_metrics, second.latest_step) == (other.id, {}, None)

    updated = store.update_run(run_id, RunUpdate(git_commit="abc123", run_dir="/runs/7"))
    assert (updated.git_commit, updated.run_dir, updated.seed) == ("abc123", "/runs/7", 7)

    done = store.finish_run(run_id, final_metrics={"accuracy": 0.61})
    assert done.status is RunStatus.finished
    assert done.final_metrics == {"accuracy": 0.61}
    assert done.finished_at is not None and done.finished_at >= done.started_at
    with pytest.raises(InvalidTransition) as caught:
        store.finish_run(run_id, status=RunStatus.failed, error="late crash")
    assert (caught.value.current, caught.value.requested) == ("finished", "failed")
    failed = store.finish_run(other.id, status="failed", error="CUDA OOM at step 3")
    assert (failed.status, failed.error) == (RunStatus.failed, "CUDA OOM at step 3")

    assert [r.id for r in store.runs(status=RunStatus.failed)] == [other.id]
    assert [r.id for r in store.runs(study_id)] == [run_id, other.id]
    assert store.runs(store.create_study("empty").id) == []


def test_latest_metric_ties_prefer_the_last_written(store: Store) -> None:
    _, _, run_id = _study_with_run(store)
    store.log_metrics(run_id, 3, {"loss": 2.0})
    store.log_metrics(run_id, 3, {"loss": 1.5})
    assert store.runs()[0].latest_metrics == {"loss": 1.5}


def test_artifacts_version_hash_and_dedupe(store: Store) -> None:
    study_id, _, _ = _study_with_run(store)
    code = "def reward(completion, answer):\n    return float(completion.strip() == answer)\n"
    first = store.add_artifact(study_id, ArtifactKind.reward, "reward.py", code)
    assert (first.version, first.kind, first.sha256) == (
        1,
        ArtifactKind.reward,
        hashlib.sha256(code.encode()).hexdigest(),
    )
    again = store.add_artifact(study_id, "reward", "reward.py", code)
    assert again == first  # identical content: no new version
    second = store.add_artifact(study_id, "reward", "reward.py", code + "# v2\n")
    assert second.version == 2 and second.sha256 != first.sha256
    # Going back to old content is a new version (history is linear).
    third = store.add_artifact(study_id, "reward", "reward.py", code)
    assert third.version == 3 and third.sha256 == first.sha256
    store.add_artifact(study_id, "workflow", "workflow.py", "async def run(llm): ...\n")
    assert store.latest_artifact(study_id, "reward.py") == third
    assert store.latest_artifact(study_id, "nope.py") is None
    assert [(a.name, a.version) for a in store.artifacts(study_id)] == [
        ("reward.py", 1),
        ("reward.py", 2),
        ("reward.py", 3),
        ("workflow.py", 1),
    ]
    assert store.get_artifact(second.id) == second
    with pytest.raises(InvalidInput, match="is a reward"):
        store.add_artifact(study_id, "workflow", "reward.py", "x")
    # Versions are per study.
    other = store.create_study("other")
    assert store.add_artifact(other.id, "reward", "reward.py", code).version == 1


def test_patch_lifecycle_pending_approved_applied(store: Store) -> None:
    study_id, _, _ = _study_with_run(store)
    base = store.add_artifact(study_id, "reward", "reward.py", "def reward(): return 0\n")
    patch = store.propose_patch(base.id, diff="-return 0\n+return 1", rationale="zero-signal groups")
    assert (patch.status, patch.base_version, patch.artifact_name, patch.study_id) == (
        PatchStatus.pending,
        1,
        "reward.py",
        study_id,
    )
    assert patch.decided_by is None and patch.decided_at is None
    assert store.pending_patches() == [patch]
    assert store.pending_patches(study_id) == [patch]

    with pytest.raises(InvalidTransition, match="only an approved patch"):
        store.mark_patch_applied(patch.id)

    approved = store.decide_patch(patch.id, approve=True, by="alice", note="looks right")
    assert (approved.status, approved.decided_by, approved.note) == (
        PatchStatus.approved,
        "alice",
        "looks right",
    )
    assert approved.decided_at is not None
    assert store.pending_patches() == []
    with pytest.raises(InvalidTransition):
        store.decide_patch(patch.id, approve=False, by="bob")

    applied = store.mark_patch_applied(patch.id, content="def reward(): return 1\n")
    assert applied.status is PatchStatus.applied and applied.applied_at is not None
    produced = store.get_artifact(applied.result_artifact_id or 0)
    assert (produced.name, produced.version, produced.content) == ("reward.py", 2, "def reward(): return 1\n")
    with pytest.raises(InvalidTransition) as caught:
        store.mark_patch_applied(patch.id)
    assert caught.value.current == "applied"
    assert store.get_patch(patch.id).decided_by == "alice"  # the trail survives


def test_rejected_patch_is_final(store: Store) -> None:
    study_id, _, _ = _study_with_run(store)
    base = store.add_artifact(study_id, "workflow", "workflow.py", "x = 1\n")
    patch = store.propose_patch(base.id, diff="-x = 1\n+x = 2", rationale="r", proposed_by="analyst")
    rejected = store.decide_patch(patch.id, approve=False, by="bob", note="touches the evaluator")
    assert rejected.status is PatchStatus.rejected
    with pytest.raises(InvalidTransition) as caught:
        store.decide_patch(patch.id, approve=True, by="bob")
    assert caught.value.current == "rejected"
    with pytest.raises(InvalidTransition) as caught:
        store.mark_patch_applied(patch.id)
    assert caught.value.current == "rejected"
    assert [p.status for p in store.patches(study_id)] == [PatchStatus.rejected]
    # A failed apply leaves no artifact version behind.
    with pytest.raises(InvalidTransition):
        store.mark_patch_applied(patch.id, content="x = 2\n")
    assert [a.version for a in store.artifacts(study_id)] == [1]
    with pytest.raises(InvalidInput):
        store.decide_patch(patch.id, approve=True, by=" ")
    with pytest.raises(InvalidInput):
        store.propose_patch(base.id, diff="", rationale="r")


def test_findings_with_evidence_and_seeds(store: Store) -> None:
    study_id, experiment_id, run_id = _study_with_run(store, seed=0)
    run2 = store.start_run(experiment_id, seed=1).id
    hypothesis = store.register_hypothesis(study_id, statement="s", expected_outcome="e", decision_rule="d")
    finding = store.add_finding(
        study_id,
        statement="KL 0.05 avoids collapse",
        confidence=0.6,
        evidence="reward kept rising, held-out flat",
        seeds=[1, 0, 1],
        run_ids=[run2, run_id],
        hypothesis_id=hypothesis.id,
    )
    assert (finding.status, finding.seeds, finding.run_ids) == (
        FindingStatus.unconfirmed,
        [0, 1],
        sorted([run_id, run2]),
    )
    refuted = store.add_finding(study_id, statement="group size matters", confidence=0.2, status="refuted")

    run3 = store.start_run(experiment_id, seed=2).id
    grown = store.add_finding_seeds(finding.id, [2], run_ids=[run3, run_id])
    assert grown.seeds == [0, 1, 2] and grown.run_ids == sorted([run_id, run2, run3])

    confirmed = store.update_finding(
        finding.id, FindingUpdate(status=FindingStatus.confirmed, confidence=0.9, run_ids=[run3])
    )
    assert (confirmed.status, confirmed.confidence, confirmed.run_ids) == (
        FindingStatus.confirmed,
        0.9,
        [run3],
    )
    assert confirmed.statement == "KL 0.05 avoids collapse"

    assert [f.id for f in store.findings(study_id)] == [finding.id, refuted.id]
    assert [f.id for f in store.findings(study_id, status="confirmed")] == [finding.id]
    assert store.findings(study_id)[0].run_ids == [run3]

    other_run = _study_with_run(store)[2]
    with pytest.raises(InvalidInput, match="belongs to study"):
        store.add_finding(study_id, statement="s", confidence=0.5, run_ids=[other_run])
    with pytest.raises(NotFound):
        store.add_finding(study_id, statement="s", confidence=0.5, run_ids=[10_000])


def test_events_are_filed_under_study_and_run(store: Store) -> None:
    study_id, _, run_id = _study_with_run(store)
    a = store.log_event("planner: starting experiment", study_id=study_id)
    b = store.log_event("step 3: reward collapsed", run_id=run_id, level="warning")
    c = store.log_event("Traceback ... ValueError", run_id=run_id, level="error")
    assert (b.study_id, b.run_id) == (study_id, run_id)
    assert [e.id for e in store.events(study_id=study_id)] == [a.id, b.id, c.id]
    assert [e.id for e in store.events(run_id=run_id)] == [b.id, c.id]
    assert [e.id for e in store.events(study_id=study_id, after_id=a.id)] == [b.id, c.id]
    assert [e.id for e in store.events(study_id=study_id, limit=1)] == [a.id]
    other = store.create_study("other")
    with pytest.raises(InvalidInput, match="belongs to study"):
        store.log_event("x", study_id=other.id, run_id=run_id)
    with pytest.raises(InvalidInput, match="level"):
        store.log_event("x", study_id=study_id, level="fatal")


def test_export_holds_everything_and_renders_markdown(store: Store) -> None:
    study_id, experiment_id, run_id = _study_with_run(store, seed=3)
    hypothesis = store.register_hypothesis(
        study_id, statement="KL helps", expected_outcome="no collapse", decision_rule="3 of 3 seeds"
    )
    store.log_metrics(run_id, 5, {"reward/mean": 0.75})
    store.finish_run(run_id, final_metrics={"accuracy": 0.5})
    artifact = store.add_artifact(study_id, "reward", "reward.py", "s = '```'\ndef reward(): return 1\n")
    patch = store.propose_patch(artifact.id, diff="d", rationale="reward | hacking")
    store.add_finding(study_id, statement="KL helps a bit", confidence=0.55, run_ids=[run_id], seeds=[3])
    store.log_event("collapse detected", run_id=run_id, level="error")
    store.log_event("debug detail", study_id=study_id, level="debug")

    export = store.export_study(study_id)
    data = export.model_dump(mode="json")
    assert data["study"]["id"] == study_id and data["schema_revision"] == "0002"
    assert data["hypotheses"][0]["id"] == hypothesis.id
    (experiment,) = data["experiments"]
    assert experiment["id"] == experiment_id
    assert experiment["runs"][0]["latest_metrics"] == {"reward/mean": 0.75}
    assert experiment["runs"][0]["final_metrics"] == {"accuracy": 0.5}
    assert data["patches"][0]["id"] == patch.id and data["artifacts"][0]["content"].startswith("s = ")
    assert len(data["events"]) == 2

    markdown = render_markdown(export)
    assert markdown.startswith(f"# Study {study_id}: Does a KL penalty prevent collapse on countdown?\n")
    for expected in (
        "## Hypotheses",
        "- Decision rule: 3 of 3 seeds",
        "accuracy=0.5",
        "reward/mean=0.75 (5)",
        "**unconfirmed** (confidence 0.55): KL helps a bit — runs",
        "reward \\| hacking",  # table cells escape pipes
        "````python",  # content holding ``` gets a longer fence
        "error (run",
    ):
        assert expected in markdown, expected
    assert "debug detail" not in markdown
