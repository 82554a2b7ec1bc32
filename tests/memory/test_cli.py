"""``a3r runs | findings | export`` on a real store (Typer's CliRunner, in process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from a3r.app.cli import app
from memory import FindingStatus, Store


@pytest.fixture
def populated(store: Store, store_url: str) -> tuple[str, int]:
    study = store.create_study("Does KL 0.05 prevent collapse?")
    experiment = store.create_experiment(study.id, "kl-0.05")
    first = store.start_run(experiment.id, name="seed0", seed=0)
    store.log_metrics(first.id, 10, {"reward/mean": 0.625, "kl": 0.031})
    store.finish_run(first.id, final_metrics={"accuracy": 0.5})
    second = store.start_run(experiment.id, name="seed1", seed=1)
    store.add_finding(
        study.id,
        statement="KL keeps reward rising",
        confidence=0.8,
        status="confirmed",
        seeds=[0, 1],
        run_ids=[first.id, second.id],
    )
    other = store.create_study("Unrelated")
    store.add_finding(other.id, statement="other finding", confidence=0.3)
    return store_url, study.id


runner = CliRunner()


def test_runs_table(populated: tuple[str, int]) -> None:
    url, study_id = populated
    result = runner.invoke(app, ["runs", "--store", url, "--study", str(study_id)])
    assert result.exit_code == 0, result.output
    assert "seed0" in result.output and "seed1" in result.output
    assert "kl=0.031" in result.output and "reward/mean=0.625" in result.output
    assert "finished" in result.output and "running" in result.output
    only_running = runner.invoke(app, ["runs", "-s", url, "--status", "running"])
    assert "seed1" in only_running.output and "seed0" not in only_running.output


def test_findings_table(populated: tuple[str, int]) -> None:
    url, study_id = populated
    everything = runner.invoke(app, ["findings", "--store", url])
    assert everything.exit_code == 0, everything.output
    assert "KL keeps reward rising" in everything.output and "other finding" in everything.output
    one = runner.invoke(app, ["findings", "--store", url, "--study", str(study_id), "--status", "confirmed"])
    assert "KL keeps reward rising" in one.output and "other finding" not in one.output
    assert "0.80" in one.output and "0,1" in one.output


def test_export_markdown_and_json(populated: tuple[str, int], tmp_path: Path) -> None:
    url, study_id = populated
    markdown = runner.invoke(app, ["export", str(study_id), "--store", url])
    assert markdown.exit_code == 0, markdown.output
    assert markdown.output.startswith(f"# Study {study_id}: Does KL 0.05 prevent collapse?")
    assert "**confirmed** (confidence 0.80): KL keeps reward rising" in markdown.output

    out = tmp_path / "study.json"
    written = runner.invoke(app, ["export", str(study_id), "-s", url, "--format", "json", "--out", str(out)])
    assert written.exit_code == 0, written.output
    data = json.loads(out.read_text())
    assert data["study"]["id"] == study_id
    assert [run["name"] for run in data["experiments"][0]["runs"]] == ["seed0", "seed1"]
    assert data["findings"][0]["run_ids"] == [run["id"] for run in data["experiments"][0]["runs"]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "999"], "error: study 999 not found"),
        (["runs", "--study", "999"], "error: study 999 not found"),
        (["findings", "--study", "999"], "error: study 999 not found"),
    ],
)
def test_unknown_study_is_one_line_and_exit_code_1(
    populated: tuple[str, int], args: list[str], message: str
) -> None:
    url, _ = populated
    result = runner.invoke(app, [*args, "--store", url])
    assert result.exit_code == 1
    assert result.output.strip() == message
    assert "Traceback" not in result.output


def test_missing_store_and_bad_url_are_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "memory.db"
    result = runner.invoke(app, ["export", "1", "--store", str(missing)])
    assert result.exit_code == 1
    assert result.output.strip() == f"error: store {missing} not found"
    assert not missing.parent.exists()  # reading never creates a store

    # Listing a store that does not exist yet (a fresh machine) is an empty listing, not an error.
    for command in ("runs", "findings"):
        listed = runner.invoke(app, [command, "--store", str(missing)])
        assert listed.exit_code == 0, listed.output
        assert "nothing recorded yet" in listed.output
        assert not missing.parent.exists()

    bad = runner.invoke(app, ["export", "1", "--store", "nosuchdialect://user:pw@host/db"])
    assert bad.exit_code == 1
    assert bad.output.startswith("error: unsupported store URL dialect") and "pw" not in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_unwritable_out_file_is_one_line(populated: tuple[str, int], tmp_path: Path) -> None:
    url, study_id = populated
    result = runner.invoke(
        app, ["export", str(study_id), "-s", url, "-o", str(tmp_path / "no" / "dir" / "x.md")]
    )
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot write")


def test_default_store_is_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with Store() as store:  # creates .a3r/memory.db here
        store.create_study("in cwd")
    assert (tmp_path / ".a3r" / "memory.db").exists()
    result = runner.invoke(app, ["export", "1"])
    assert result.exit_code == 0 and "in cwd" in result.output


def test_a_not_run_finding_is_stored_and_shown_as_not_run(store: Store, store_url: str) -> None:
    # issue 33: a configuration with no completed run is "not run" in the store, not "unconfirmed"
    study = store.create_study("find min stable batch size on arithmetic")
    statement = "not run: batch_size=8 gave no evidence, no claim is made about it (seed 0: cancelled)"
    store.add_finding(study.id, statement=statement, confidence=0.0, status=FindingStatus.not_run)
    (stored,) = store.findings(study.id, status=FindingStatus.not_run)
    assert stored.status is FindingStatus.not_run and stored.status.label == "not run"
    found = runner.invoke(app, ["findings", "-s", store_url, "--status", "not_run"], env={"COLUMNS": "200"})
    assert found.exit_code == 0, found.output
    assert "not run" in found.output and "unconfirmed" not in found.output
    markdown = runner.invoke(app, ["export", str(study.id), "-s", store_url]).output
    assert f"- **not run** (confidence 0.00): {statement}" in markdown
    data = json.loads(runner.invoke(app, ["export", str(study.id), "-s", store_url, "-f", "json"]).output)
    assert data["findings"][0]["status"] == "not_run"


def test_numbers_and_seed_lists_read_plainly(store: Store, store_url: str) -> None:
    study = store.create_study("precision")
    experiment = store.create_experiment(study.id, "e")
    run = store.start_run(experiment.id, name="noise", seed=0)
    store.log_metrics(run.id, 3, {"reward_mean": 1.388e-17, "steps": 12.0, "eval/pass_at_1": 2 / 3})
    store.add_finding(study.id, statement="one seed", confidence=0.5, seeds=[0], run_ids=[run.id])
    listed = runner.invoke(app, ["runs", "--store", store_url], env={"COLUMNS": "200"})
    assert "reward_mean=0 " in listed.output and "e-17" not in listed.output
    assert "steps=12 " in listed.output and "eval/pass_at_1=0.6667" in listed.output
    found = runner.invoke(app, ["findings", "--store", store_url], env={"COLUMNS": "200"})
    assert "1 seed: 0" in found.output


def test_markdown_export_has_valid_json_evidence_and_summarises_long_data(
    store: Store, store_url: str
) -> None:
    study = store.create_study("export")
    evidence = json.dumps({"effect": {"low": float("nan"), "high": 0.5}})  # json writes NaN by default
    store.add_finding(study.id, statement="s", confidence=0.5, evidence=evidence)
    tasks = "".join(json.dumps({"task": i}) + "\n" for i in range(327))
    store.add_artifact(study.id, "data", "tasks.jsonl", tasks)
    markdown = runner.invoke(app, ["export", str(study.id), "--store", store_url]).output
    assert "NaN" not in markdown and '"low": null' in markdown
    (artifact,) = store.artifacts(study.id)
    named = f"tasks.jsonl v1 in the store (327 lines, {len(tasks):,} bytes, sha256 {artifact.sha256})"
    assert named in markdown
    assert '{"task": 19}' in markdown and '{"task": 20}' not in markdown
    text = runner.invoke(app, ["export", str(study.id), "-s", store_url, "-f", "json"]).output
    data = json.loads(text, parse_constant=_refuse)
    # found by a fresh user: the JSON export inlined all of tasks.jsonl, and NaN inside the evidence string
    assert data["artifacts"][0]["content"] is None and data["artifacts"][0]["stored_as"] == named
    assert '{"task": 0}' not in text and "NaN" not in text
    (finding,) = data["findings"]
    assert json.loads(finding["evidence"], parse_constant=_refuse) == {"effect": {"low": None, "high": 0.5}}


def _refuse(constant: str) -> object:
    raise ValueError(f"{constant} is not JSON")


def test_a_time_stamp_is_not_shown_as_a_metric(store: Store, store_url: str) -> None:
    """Found by a fresh user: ``a3r export`` showed ``created_at`` (a step row's Unix time) as a metric.
    A store written before a3r stopped logging it keeps it; ``a3r runs`` and both exports leave it out."""
    study = store.create_study("stamps")
    run = store.start_run(store.create_experiment(study.id, "e").id, name="stamped", seed=0)
    store.log_metrics(run.id, 1, {"reward_mean": 0.25, "created_at": 1764900000.5})
    store.finish_run(run.id, final_metrics={"reward_mean": 0.5, "created_at": 1764900001.5})
    markdown = runner.invoke(app, ["export", str(study.id), "--store", store_url])
    assert markdown.exit_code == 0, markdown.output
    assert "reward_mean=0.5" in markdown.output and "created_at" not in markdown.output
    exported = json.loads(runner.invoke(app, ["export", str(study.id), "-s", store_url, "-f", "json"]).output)
    (row,) = exported["experiments"][0]["runs"]
    assert row["final_metrics"] == {"reward_mean": 0.5} and row["latest_metrics"] == {"reward_mean": 0.25}
    assert [p["name"] for p in row["metric_points"]] == ["reward_mean"]
    listed = runner.invoke(app, ["runs", "--store", store_url, "--study", str(study.id)])
    assert "reward_mean=0.5" in listed.output and "created_at" not in listed.output
    assert "in a3r export" not in listed.output  # no hidden metric left to point to


@pytest.mark.parametrize("command", ["runs", "findings"])
def test_tables_fit_the_terminal_width(populated: tuple[str, int], command: str) -> None:
    """Found by a fresh user: both tables were drawn 200 columns wide whatever the terminal, so an
    80-column terminal wrapped every row into a mess."""
    url, _ = populated
    result = runner.invoke(app, [command, "--store", url], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80, result.output
    assert ("seed0" if command == "runs" else "rising") in result.output
