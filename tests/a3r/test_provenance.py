"""Provenance: the commit, dirty flag and versions of a real git checkout, and a3r writing them on its runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from a3r.graph.context import Ledger, RunContext
from a3r.graph.records import ensure_run
from a3r.providers import OfflineProvider
from a3r.study.plans import TrainingSettings
from a3r.study.provenance import collect_provenance
from a3r.study.runs import RunSpec
from memory import Store


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _repo(root: Path) -> str:
    root.mkdir()
    _git(root, "init", "-q")
    (root / "code.py").write_text("x = 1\n")
    _git(root, "add", "code.py")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q", "-m", "first")
    return _git(root, "rev-parse", "HEAD")


def test_a_checkout_gives_its_commit_and_dirty_flag(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    head = _repo(repo)
    clean = collect_provenance(repo)
    assert clean.git_commit == head and len(head) == 40
    assert clean.dirty is False
    (repo / "untracked.txt").write_text("not code of the commit's files\n")
    assert collect_provenance(repo).dirty is False
    (repo / "code.py").write_text("x = 2\n")
    assert collect_provenance(repo).dirty is True
    assert clean.versions["torch"] and clean.versions["a3r"]
    assert int(clean.machine["cores"]) >= 1 and clean.machine["cpu"]
    (repo / "site-packages").mkdir()  # a package installed inside another project's tree is not that project
    assert collect_provenance(repo / "site-packages").git_commit is None


def test_outside_git_the_commit_is_unknown_but_versions_are_kept(tmp_path: Path) -> None:
    bare = collect_provenance(tmp_path)
    assert bare.git_commit is None and bare.dirty is None
    assert "transformers" in bare.versions


def test_a3r_writes_the_commit_and_versions_on_each_run(tmp_path: Path) -> None:
    with Store(tmp_path / "memory.db") as store:
        experiment = store.create_experiment(store.create_study("provenance").id, "e").id
        ctx = RunContext(
            store=store,
            provider=OfflineProvider(),
            ledger=Ledger(tmp_path / "ledger.db"),
            thread_id="t",
            root=tmp_path,
        )
        spec = RunSpec(key="train-s0", purpose="train", settings=TrainingSettings(steps=1))
        run = ensure_run(ctx, experiment, spec)
        expected = collect_provenance()
        assert run.git_commit == expected.git_commit
        assert expected.git_commit is not None  # the tests run from a checkout
        assert run.config["provenance"]["versions"] == expected.versions
        assert run.config["provenance"]["dirty"] == expected.dirty
        assert run.config["steps"] == 1
        assert ensure_run(ctx, experiment, spec).id == run.id  # started once
