"""Provenance of a run: the git commit of the code, whether it had uncommitted changes, the machine and
the versions of the packages that shape training, recorded on every store run (`Run.git_commit` and
``config["provenance"]``) so that results can be compared across versions.

Read-only and best effort: outside a git checkout (an installed wheel) the commit is ``None`` and the
package versions still say what ran.
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel, ConfigDict

__all__ = ["PACKAGES", "Provenance", "collect_provenance", "cpu_model"]

PACKAGES = ("a3r", "torch", "transformers", "peft", "vllm")
"""Distributions whose versions are recorded (a missing one is left out)."""

_SOURCE = Path(__file__).resolve().parents[2]
"""Root of the source tree this module was loaded from (a git checkout when run from source)."""


class Provenance(BaseModel):
    """Where a result came from.

    Attributes:
        git_commit: Full hash of ``HEAD`` of the checkout holding the code, ``None`` outside git.
        dirty: The checkout had uncommitted changes to tracked files (``None`` outside git).
        versions: Installed version by distribution name (of `PACKAGES`).
        python: Python version.
        machine: CPU model and the number of CPUs this process may use.
    """

    model_config = ConfigDict(frozen=True)

    git_commit: str | None
    dirty: bool | None
    versions: dict[str, str]
    python: str
    machine: dict[str, str | int]


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux), else `platform.processor`, else ``"unknown"``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def collect_provenance(root: Path | None = None) -> Provenance:
    """The provenance of code in the checkout rooted at ``root`` (default: the tree holding this package).

    Never raises for a missing git, a folder that is not a checkout's root, or a tree outside git:
    then ``git_commit`` and ``dirty`` are ``None``.
    """
    where = (root or _SOURCE).resolve()
    top = _git(where, "rev-parse", "--show-toplevel")
    # Only the checkout rooted here: an installed package inside another project's repository (a venv
    # in its tree) would otherwise report that project's commit.
    commit = _git(where, "rev-parse", "HEAD") if top is not None and Path(top).resolve() == where else None
    status = None if commit is None else _git(where, "status", "--porcelain", "--untracked-files=no")
    versions: dict[str, str] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return Provenance(
        git_commit=commit,
        dirty=None if status is None else bool(status),
        versions=versions,
        python=platform.python_version(),
        machine={"cpu": cpu_model(), "cores": _usable_cpus()},
    )
