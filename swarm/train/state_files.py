"""Trainer state that the trainer's own worker processes write as files, beside the checkpoint writer.

A trainer whose state lives in other processes (verl: each FSDP rank holds its shard of AdamW) does not
hand that state to the server as tensors: its ``state_dict()`` holds a :class:`StagedFiles` instead, a
folder its workers are writing into (from their CPU copy, taken when ``state_dict()`` was called). The
server's checkpoint writer (`swarm.server.checkpoints.save_checkpoint`) calls :func:`commit_state_files`
before it writes ``trainer_state.pt``: it waits until the workers' write is complete (the folder's
completion marker, e.g. DCP's ``.metadata``, written last by a rename), moves the folder into the
checkpoint's temporary folder and stores a :class:`StateFiles` (the folder's name in the checkpoint) in
its place. The checkpoint folder is renamed into place and marked complete (``meta.json``) only after
that, so a kill at any moment never yields a checkpoint whose state files a resume would trust.
:func:`resolve_state_files` (on load) gives each :class:`StateFiles` its absolute folder;
:meth:`StateFiles.check` refuses a missing or incomplete one.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

FAILED = "FAILED"
"""A file a worker writes into the staging folder when its write failed (its text: the error)."""

POLL_S = 0.05
"""How often the checkpoint writer looks for the completion marker."""


class StateFilesError(RuntimeError):
    """State files a checkpoint needs are missing, incomplete, failed or late."""


@dataclass(frozen=True)
class StateFiles:
    """A checkpoint's reference to a folder of state files written by a trainer's workers.

    Stored in ``trainer_state.pt`` with ``path`` ``None`` (the folder is ``name`` inside the checkpoint);
    :func:`resolve_state_files` sets ``path`` when the checkpoint is loaded.
    """

    name: str
    """The folder's name inside the checkpoint (e.g. ``verl_optimizer``)."""
    marker: str
    """The file whose presence says the folder is complete (written last, by a rename)."""
    path: Path | None = None
    """The folder, absolute (a loaded checkpoint's); ``None`` in the stored reference."""

    def check(self) -> Path:
        """The folder, if it is there and complete.

        Raises:
            StateFilesError: not resolved, missing, or without its completion marker.
        """
        if self.path is None:
            raise StateFilesError(f"state files {self.name!r}: not resolved against a checkpoint folder")
        if not self.path.is_dir():
            raise StateFilesError(f"{self.path} is missing")
        if not (self.path / self.marker).is_file():
            raise StateFilesError(f"{self.path} is incomplete (no {self.marker})")
        return self.path

    def copy_into(self, folder: Path) -> StateFiles:
        """Link (or copy, across file systems) this checkpoint's complete folder into ``folder`` under its
        name; returns the reference stored there. The files are never rewritten, so links are safe."""
        source = self.check()
        shutil.copytree(source, folder / self.name, copy_function=_link_or_copy)
        return StateFiles(self.name, self.marker)


@dataclass(frozen=True)
class StagedFiles:
    """State files a trainer's workers are writing into ``staging`` (a trainer's ``state_dict()`` value).

    Complete once ``staging / marker`` exists; failed once a worker wrote ``staging / FAILED``.
    """

    staging: Path
    """The folder the workers write into (on the checkpoints' file system, so the move is a rename)."""
    name: str
    """The folder's name inside the checkpoint."""
    marker: str
    """The file the workers write last (by a rename): the folder is complete."""
    timeout_s: float
    """How long :meth:`wait` waits for the marker."""

    def wait(self) -> float:
        """Return once the workers' write is complete; returns the seconds waited.

        Raises:
            StateFilesError: a worker reported a failure, or no marker after ``timeout_s``.
        """
        started = time.monotonic()
        while True:
            failed = self.staging / FAILED
            if failed.is_file():
                raise StateFilesError(f"writing {self.name} failed: {failed.read_text().strip()[:500]}")
            if (self.staging / self.marker).is_file():
                return time.monotonic() - started
            if time.monotonic() - started > self.timeout_s:
                raise StateFilesError(
                    f"writing {self.name} into {self.staging} did not end within {self.timeout_s:g} s "
                    f"(no {self.marker})"
                )
            time.sleep(POLL_S)

    def commit(self, folder: Path) -> StateFiles:
        """:meth:`wait`, then move the staging folder to ``folder / name``; returns the reference to
        store in its place."""
        self.wait()
        target = folder / self.name
        try:
            os.replace(self.staging, target)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            shutil.move(str(self.staging), str(target))  # another file system: a copy
        return StateFiles(self.name, self.marker)

    def discard(self) -> None:
        """Remove the staging folder (a failed checkpoint's)."""
        shutil.rmtree(self.staging, ignore_errors=True)


def commit_state_files(state: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    """``state`` (a trainer state dict) with each top-level :class:`StagedFiles` committed into
    ``folder`` (waits for its workers) and each loaded :class:`StateFiles` linked into it (a state
    restored but not yet trained on, saved again): both replaced by their stored :class:`StateFiles`.

    Raises:
        StateFilesError: a write failed or timed out, or a loaded folder is missing or incomplete.
    """
    out = dict(state)
    for key, value in state.items():
        if isinstance(value, StagedFiles):
            out[key] = value.commit(folder)
        elif isinstance(value, StateFiles) and value.path is not None:
            out[key] = value.copy_into(folder)
    return out


def discard_staged(state: Mapping[str, Any]) -> None:
    """Remove the staging folders of ``state``'s :class:`StagedFiles` (a checkpoint that failed)."""
    for value in state.values():
        if isinstance(value, StagedFiles):
            value.discard()


def resolve_state_files(state: Mapping[str, Any], checkpoint: Path) -> dict[str, Any]:
    """``state`` (loaded from ``checkpoint``'s ``trainer_state.pt``) with each :class:`StateFiles` given
    its absolute folder in ``checkpoint``."""
    return {
        key: replace(value, path=checkpoint / value.name) if isinstance(value, StateFiles) else value
        for key, value in state.items()
    }


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
