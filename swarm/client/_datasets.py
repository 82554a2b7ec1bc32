"""Task sources for the runner: JSONL files, locally saved Hugging Face datasets, Python generators.

Every source yields :class:`Task` records in a fixed order. A task's id is its ``id`` field (as a
string) when it has one, else its 0-based position; all G episodes of a task share that id, so the
server groups them (GRPO). Resuming a run relies on the order and ids being the same on the next
start, so a generator must be deterministic (seed it).

- ``*.jsonl`` / ``*.json`` lines: one JSON object per line; blank lines are skipped; a bad line is a
  :class:`DatasetError` naming the line before any episode starts.
- a directory written by ``datasets.Dataset.save_to_disk`` (``datasets`` is imported only then; for a
  ``DatasetDict`` the ``split`` argument, else ``train``, else its only split).
- ``file.py:function`` or a Python callable returning an iterable of dicts (called once per epoch),
  or any iterable of dicts (used for one pass).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.client._errors import DatasetError, WorkflowLoadError
from swarm.client._loader import _split_spec, import_file


@dataclass(frozen=True)
class Task:
    """One dataset record with its position and id."""

    index: int
    """0-based position in the source."""
    task_id: str
    """``record["id"]`` as a string, else ``str(index)``."""
    data: dict[str, Any]
    """The record, passed to ``run(task, llm)`` as is."""


def _task(index: int, record: Any, source: str, line: int | None = None) -> Task:
    if not isinstance(record, dict):
        raise DatasetError(source, f"a task must be a JSON object, got {type(record).__name__}", line=line)
    task_id = record.get("id")
    return Task(index, str(index) if task_id is None else str(task_id), record)


def read_jsonl(path: Path) -> list[Task]:
    """Read a JSONL file of task objects.

    Raises:
        DatasetError: the file is missing, a line is not valid JSON, or a line is not an object.
    """
    shown = str(path)
    if not path.is_file():
        raise DatasetError(shown, "no such file")
    tasks: list[Task] = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    shown, f"invalid JSON ({exc.msg} at column {exc.colno})", line=number
                ) from None
            tasks.append(_task(len(tasks), record, shown, number))
    if not tasks:
        raise DatasetError(shown, "holds no tasks")
    return tasks


def read_hf_dataset(path: Path, split: str | None = None) -> list[Task]:
    """Read a dataset saved with ``save_to_disk`` (needs the optional ``datasets`` package).

    Raises:
        DatasetError: ``datasets`` is not installed, the folder is not a saved dataset, or the split
            is ambiguous or missing.
    """
    shown = str(path)
    try:
        import datasets
    except ImportError:
        raise DatasetError(
            shown, "reading a saved Hugging Face dataset needs 'pip install datasets'"
        ) from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as exc:
        raise DatasetError(shown, f"not a saved Hugging Face dataset: {exc}") from None
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded.keys())
        chosen = split or ("train" if "train" in names else (names[0] if len(names) == 1 else None))
        if chosen is None or chosen not in loaded:
            raise DatasetError(shown, f"pick a split with --split (has {', '.join(names)})")
        loaded = loaded[chosen]
    tasks = [_task(i, row, shown) for i, row in enumerate(loaded)]
    if not tasks:
        raise DatasetError(shown, "holds no tasks")
    return tasks


class TaskSet:
    """A re-iterable task source (one pass per epoch).

    Args:
        source: a JSONL path, a saved HF dataset folder, ``file.py:function``, a callable returning an
            iterable of dicts, or an iterable of dicts.
        split: split of a saved ``DatasetDict``.

    Raises:
        DatasetError: unreadable file or record (files are read and checked here, before any episode).
    """

    def __init__(
        self,
        source: str | Path | Callable[[], Iterable[dict[str, Any]]] | Iterable[dict[str, Any]],
        *,
        split: str | None = None,
    ) -> None:
        self._tasks: list[Task] | None = None
        self._factory: Callable[[], Iterable[dict[str, Any]]] | None = None
        self._once: Iterable[dict[str, Any]] | None = None
        self.name = "tasks"
        if isinstance(source, str | Path):
            self.name = str(source)
            self._init_path(str(source), split)
        elif callable(source):
            self.name = getattr(source, "__name__", "generator")
            self._factory = source
        else:
            self._once = source

    def _init_path(self, spec: str, split: str | None) -> None:
        path, attr = _split_spec(spec)
        if attr is not None or path.suffix == ".py":
            if attr is None:
                raise DatasetError(spec, "name the generator function: FILE.py:FUNCTION")
            try:
                module = import_file(path)
            except WorkflowLoadError as exc:
                raise DatasetError(spec, str(exc).removeprefix(f"{path}: ")) from None
            factory = getattr(module, attr, None)
            if not callable(factory):
                raise DatasetError(spec, f"defines no function {attr!r}")
            self._factory = factory
        elif path.is_dir():
            self._tasks = read_hf_dataset(path, split)
        else:
            self._tasks = read_jsonl(path)

    def __len__(self) -> int:
        """Number of tasks (only for file sources; generators have no length)."""
        if self._tasks is None:
            raise TypeError("a generator task source has no length")
        return len(self._tasks)

    @property
    def sized(self) -> bool:
        return self._tasks is not None

    def __iter__(self) -> Iterator[Task]:
        if self._tasks is not None:
            yield from self._tasks
            return
        if self._factory is not None:
            records: Iterable[dict[str, Any]] = self._factory()
        elif self._once is not None:
            records, self._once = self._once, ()
        else:  # pragma: no cover - one of the three is always set
            return
        for index, record in enumerate(records):
            yield _task(index, record, self.name)
