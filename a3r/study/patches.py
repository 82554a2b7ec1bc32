"""Patches of a study's workspace: an allow-list, unified diffs (difflib) and safe application.

Patches may touch only the training workflow, reward and data files of a workspace (`PATCHABLE`).
Evaluators (the frozen copy under ``evaluator/``), held-out data and limits (``heldout.jsonl``,
``limits.json``) are never patchable, nor is anything outside the workspace: `check_allowed` is the
single gate, called when a patch is proposed and again when it is applied.
"""

from __future__ import annotations

import difflib
import hashlib
from pathlib import Path, PurePosixPath

from a3r.errors import PatchConflict, PatchNotAllowed

__all__ = ["PATCHABLE", "apply_patch", "check_allowed", "content_hash", "unified_diff"]

PATCHABLE: frozenset[str] = frozenset({"workflow.py", "reward.py", "data.py", "tasks.jsonl"})
"""Workspace-relative files a patch may change (top level of the workspace only)."""

_FORBIDDEN_HINT = "evaluators, held-out data and limits are never patched"


def check_allowed(workspace: Path, file: str) -> Path:
    """Resolve a patch target and check it against the allow-list.

    Args:
        workspace: The study workspace root.
        file: Path relative to the workspace, e.g. ``"workflow.py"``.

    Returns:
        The absolute path of the target.

    Raises:
        PatchNotAllowed: An absolute path, a path leaving the workspace, a nested path, a symlink, or a
            file not in `PATCHABLE`.
    """
    relative = PurePosixPath(file.replace("\\", "/"))
    if relative.is_absolute() or ".." in relative.parts or len(relative.parts) != 1:
        raise PatchNotAllowed(f"patch target {file!r} is not a top-level workspace file; {_FORBIDDEN_HINT}")
    if relative.name not in PATCHABLE:
        raise PatchNotAllowed(
            f"patch target {file!r} is not patchable (allowed: {', '.join(sorted(PATCHABLE))}); {_FORBIDDEN_HINT}"
        )
    target = workspace / relative.name
    if target.is_symlink() or target.resolve().parent != workspace.resolve():
        raise PatchNotAllowed(f"patch target {file!r} resolves outside the workspace")
    return target


def content_hash(text: str) -> str:
    """SHA-256 hex digest of UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def unified_diff(old: str, new: str, file: str) -> str:
    """Unified diff of two versions of ``file`` (``a/file`` → ``b/file``), empty when equal."""
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{file}", f"b/{file}"
        )
    )


def apply_patch(workspace: Path, file: str, *, base: str, new: str) -> bool:
    """Write ``new`` into a workspace file whose current content is ``base``; idempotent.

    Args:
        workspace: Study workspace.
        file: Allowed target (see `check_allowed`).
        base: The content the patch was computed against.
        new: The patched content.

    Returns:
        ``True`` when the file was written, ``False`` when it already held ``new`` (a resumed node).

    Raises:
        PatchNotAllowed: The target is not patchable.
        PatchConflict: The file holds neither ``base`` nor ``new``.
    """
    target = check_allowed(workspace, file)
    current = target.read_text(encoding="utf-8") if target.exists() else ""
    if current == new:
        return False
    if current != base:
        raise PatchConflict(f"{file} changed since the patch was proposed; propose it again")
    tmp = target.with_suffix(target.suffix + ".a3r-tmp")
    tmp.write_text(new, encoding="utf-8")
    tmp.replace(target)
    return True
