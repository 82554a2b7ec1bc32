"""``bench/track.py`` end to end with tiny settings: the real CLI in a subprocess, the real store, the real
tokenizer and trainer; a regression against an injected history fails the run with one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import track
from track_history import Status, load_history, record_run

from a3r.study.provenance import collect_provenance
from memory import RunStatus, Store

ROOT = Path(__file__).resolve().parents[2]
TRACK = ROOT / "bench" / "track.py"
TINY = [
    "--set", "merge_episodes=1", "--set", "merge_calls=3",
    "--set", "update_small=true", "--set", "update_repeats=1", "--set", "update_seqs=2",
    "--set", "update_prompt=4", "--set", "update_completion=8", "--set", "threads=1",
]  # fmt: skip


def _track(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TRACK), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )


def test_quick_records_each_benchmark_and_fails_on_a_regression(tmp_path: Path) -> None:
    db = tmp_path / "track.db"
    old = "0" * 40
    with Store(db) as store:  # an earlier commit whose merge ratio was far higher: the new one regresses
        for seed in range(3):
            record_run(
                store,
                benchmark="merge",
                description="injected",
                seed=seed,
                git_commit=old,
                config={
                    "mode": "quick",
                    "settings": track.settings_from(track.QUICK, TINY[1::2]).model_dump(mode="json"),
                    "provenance": {"machine": collect_provenance().machine},
                },
                steps=[{"tokens_ratio": 50.0}],
                final={"tokens_ratio": 50.0},
            )
    done = _track(
        "--quick", "--only", "merge", "--only", "update", *TINY,
        "--store", str(db), "--html", str(tmp_path / "html"), "--fail-on-regression",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("regression: merge tokens_ratio -")
    assert "Traceback" not in done.stderr
    with Store(db) as store:
        history = load_history(store)
        head = collect_provenance().git_commit
        new = [r for r in history.runs["merge"] if r.commit == head]
        assert len(new) == 1 and new[0].run.status is RunStatus.finished
        assert new[0].run.config["mode"] == "quick" and "torch" in new[0].run.config["provenance"]["versions"]
        assert new[0].run.config["settings"]["merge_calls"] == 3
        assert 1.0 < new[0].value("tokens_ratio") < 50.0  # type: ignore[operator]
        update = history.runs["update"][0]
        assert update.commit == head and update.value("cpu_s") > 0  # type: ignore[operator]
        assert update.value("step_s") > 0  # type: ignore[operator]
        assert len(store.metric_history(update.run.id, "cpu_s")) == 1
    page = (tmp_path / "html" / "index.html").read_text()
    assert page.count("<svg") == 2 and "class='regression'" in page

    again = _track("--report-only", "--only", "merge", "--store", str(db))
    assert again.returncode == 0 and Status.regression.value in again.stdout


def test_a_bad_setting_is_one_readable_line(tmp_path: Path) -> None:
    done = _track("--quick", "--set", "nope=1", "--store", str(tmp_path / "x.db"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "expected NAME=VALUE" in done.stderr
    done = _track("--quick", "--only", "nope", "--store", str(tmp_path / "x.db"))
    assert done.returncode == 2 and "unknown benchmark 'nope'" in done.stderr


def test_the_committed_history_loads_and_the_page_shows_its_four_commits(tmp_path: Path) -> None:
    """A fresh clone: an empty store, the committed ``bench/history/track.json``, no benchmark run."""
    history_file = ROOT / "bench" / "history" / "track.json"
    assert history_file.stat().st_size < 300_000
    db, html = tmp_path / "track.db", tmp_path / "html"
    args = ["--report-only", "--store", str(db), "--history", str(history_file), "--html", str(html)]
    done = _track(*args, "--export", str(tmp_path / "again.json"))
    assert done.returncode == 0, done.stderr
    page = (html / "index.html").read_text()
    versions = page[page.index("id='versions'") : page.index("</table>", page.index("id='versions'"))]
    commits = ("427044d351", "04bd9c5a62", "76d39ab062", "3383f1873d")
    assert versions.count("<tr>") == 1 + len(commits) and all(c in versions for c in commits)
    assert page.count("<svg") == 5  # learning, merge, throughput, update, spy
    with Store(db) as store:
        history = load_history(store)
        assert history.commits() == [
            "427044d3513f223e4268ddeebb21ffff88142741",
            "04bd9c5a623d7cb6cf27813064bf82954063deeb",
            "76d39ab0627a00641e7cc5458f8188c2d4cb70a3",
            "3383f1873dd3de46575003b5a46076f946159b42",
        ]
        runs = [r for rs in history.runs.values() for r in rs]
        assert len(runs) == 33 and all(store.metric_history(r.run.id) for r in runs)
        assert all("load_avg_1m" in r.run.config for r in runs)
    # Loading it again duplicates nothing; its export is the committed file but for the export time.
    again = _track(*args)
    assert again.returncode == 0, again.stderr
    with Store(db) as store:
        assert len(store.studies()) == 1 and len(store.runs()) == 33
    exported = json.loads((tmp_path / "again.json").read_text())
    committed = json.loads(history_file.read_text())
    assert exported == committed  # exported_at is the newest record's time: an unchanged history, same bytes


def test_a_history_file_that_is_not_a_tracking_export_is_one_readable_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"study": 1}')
    done = _track("--report-only", "--store", str(tmp_path / "x.db"), "--history", str(bad))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        "bad.json: not a study export: schema_revision: Field required (and 8 more problems)" in done.stderr
    )
    assert not (tmp_path / "x.db").exists()  # the file was refused before the store was opened
    with Store(tmp_path / "x.db") as store:
        store.create_study("not a tracking study")
    done = _track("--report-only", "--store", str(tmp_path / "x.db"), "--export", str(tmp_path / "o.json"))
    assert done.returncode == 2 and "holds no tracking study" in done.stderr


def test_report_only_on_a_mistyped_store_path_creates_nothing(tmp_path: Path) -> None:
    done = _track("--report-only", "--store", str(tmp_path / "typo.db"), "--html", str(tmp_path / "h"))
    assert done.returncode == 2 and "typo.db: no such store" in done.stderr
    assert not (tmp_path / "typo.db").exists() and not (tmp_path / "h").exists()


def _one_line_error(done: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert done.returncode == code, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_impossible_settings_are_refused_before_a_store_is_created(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    for setting, expected in [
        ("merge_episodes=-3", "merge_episodes: Input should be greater than or equal to 1"),
        ("merge_episodes=0", "merge_episodes: Input should be greater than or equal to 1"),
        ("throughput_concurrency=[]", "throughput_concurrency: Tuple should have at least 1 item"),
        ("throughput_concurrency=[4,0]", "throughput_concurrency.1: Input should be greater than"),
        ("spy_temperature=-1", "spy_temperature: Input should be greater than or equal to 0"),
        ('learning_mixed_precision="bf32"', "learning_mixed_precision: Input should be 'auto'"),
    ]:
        done = _track("--quick", "--only", "merge", "--set", setting, "--store", str(db))
        assert expected in _one_line_error(done)
    assert not db.exists()
    assert track.SuiteSettings().merge_episodes == 2  # the defaults themselves are within range
    assert track.FULL.spy_games == 6


def test_an_invocation_whose_every_run_failed_exits_nonzero(tmp_path: Path) -> None:
    """A checkout (``--code``) whose tracking package cannot be imported: each merge run fails (recorded)."""
    broken = tmp_path / "old" / "swarm" / "tracking"
    broken.mkdir(parents=True)
    (broken.parent / "__init__.py").touch()
    (broken / "__init__.py").write_text('raise ImportError("this commit cannot import it")\n')
    db = tmp_path / "x.db"
    done = _track(
        "--quick", "--only", "merge", "--seeds", "0,1", "--code", str(tmp_path / "old"), "--store", str(db)
    )
    assert "every benchmark run failed (2 runs" in _one_line_error(done, code=1)
    with Store(db) as store:
        assert [r.status for r in store.runs()] == [RunStatus.failed] * 2


def test_a_module_the_code_checkout_lacks_is_not_taken_from_this_tree(tmp_path: Path) -> None:
    """``--code`` measures the checkout's ``swarm`` only: a checkout without ``swarm/tracking`` cannot
    run the merge benchmark (before, this tree's module was imported and the run passed as the old one)."""
    (tmp_path / "old" / "swarm").mkdir(parents=True)
    (tmp_path / "old" / "swarm" / "__init__.py").touch()
    db = tmp_path / "x.db"
    done = _track("--quick", "--only", "merge", "--code", str(tmp_path / "old"), "--store", str(db))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "in the --code checkout" in done.stdout + done.stderr
    with Store(db) as store:
        assert [r.status for r in store.runs()] == [RunStatus.failed]


def test_a_bad_history_file_leaves_the_store_alone(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("not json")
    db = tmp_path / "x.db"
    for history in ("bad.json", "missing.json"):
        for mode in ("--report-only", "--quick"):
            done = _track(mode, "--store", str(db), "--history", str(tmp_path / history))
            assert f"{history}: " in _one_line_error(done)
    assert not db.exists()
    with Store(db) as store:
        store.create_study("an existing store")
    before = db.read_bytes()
    done = _track("--quick", "--store", str(db), "--history", str(tmp_path / "bad.json"))
    assert "not a study export" in _one_line_error(done)
    assert db.read_bytes() == before


def test_a_mistyped_store_or_export_path_creates_no_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent" / "dir"
    done = _track("--quick", "--only", "merge", "--store", str(missing / "x.db"))
    assert "no such folder" in _one_line_error(done)
    done = _track(
        "--quick", "--only", "merge", "--store", str(tmp_path / "x.db"), "--export", str(missing / "x.json")
    )
    assert "--export" in _one_line_error(done) and "no such folder" in done.stderr
    done = _track("--quick", "--only", "merge", "--store", str(tmp_path / "x.db"), "--export", str(tmp_path))
    assert "a folder; give the JSON file to write" in _one_line_error(done)
    assert not (tmp_path / "nonexistent").exists() and not (tmp_path / "x.db").exists()


def test_report_only_refuses_options_that_would_do_nothing(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    with Store(db) as store:
        store.create_study("an existing store")
    done = _track("--report-only", "--store", str(db), "--set", "threads=1", "--seeds", "0")
    assert "--set and --seeds: --report-only runs no benchmark" in _one_line_error(done)
    done = _track("--report-only", "--store", str(db), "--seeds", "0")
    assert "--seeds: --report-only runs no benchmark" in _one_line_error(done)
    done = _track("--report-only", "--only", "spy", "--store", str(db))
    assert done.returncode == 0, done.stderr
    assert "no spy runs in this store" in done.stdout


def test_report_only_writes_no_store_it_was_not_given_and_names_the_checked_out_commit(
    tmp_path: Path,
) -> None:
    """Found by a fresh user: ``--report-only --history …`` wrote a study with 33 runs into the user's
    ``.a3r/memory.db``, and judged the history's latest commit as if it were the checked-out one."""
    history_file = ROOT / "bench" / "history" / "track.json"
    done = subprocess.run(
        [sys.executable, str(TRACK), "--report-only", "--history", str(history_file)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / ".a3r").exists()  # the history went to a scratch store, deleted at exit
    text = " ".join(done.stdout.split())
    assert "the checked-out commit" in text and "judged their latest commit" in text
