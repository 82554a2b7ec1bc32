"""Load a workflow file: ``async def run(task, llm)``, or a class with that method.

The file is imported by path as a fresh top-level module under a unique name (``_swarm_workflow_<n>``)
every time it is loaded, so an edited file is read again (a restarted runner always sees the current
code). Its folder is put on ``sys.path`` first so it can import its neighbours.

``path.py:Name`` picks an attribute explicitly (a function, a class or an instance). Without a name
the module's ``run`` function is used; failing that, the single class defined in the file that has an
``async def run`` method (instantiated without arguments).
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from swarm.client._errors import WorkflowLoadError
from swarm.client.workflow import LLM, Result

WorkflowOutput = float | Result | Mapping[str, float | Result]
"""What ``run`` returns: a reward, a :class:`Result`, or (multi-model) one of those per server name."""

WorkflowFn = Callable[[dict[str, Any], LLM | Mapping[str, LLM]], Awaitable[WorkflowOutput]]
"""The loaded workflow: ``await fn(task, llm)``."""

_counter = itertools.count()


def _split_spec(spec: str) -> tuple[Path, str | None]:
    """``"dir/wf.py:Agent"`` → (path, "Agent"); a Windows drive colon is not a separator."""
    head, sep, tail = spec.rpartition(":")
    if sep and head and tail.isidentifier() and not (len(head) == 1 and head.isalpha()):
        return Path(head), tail
    return Path(spec), None


def import_file(path: Path) -> Any:
    """Import ``path`` as a new module (never reusing an earlier import of it).

    Raises:
        WorkflowLoadError: the file is missing, not a ``.py`` file, or raises while importing.
    """
    shown = str(path)
    if not path.is_file():
        raise WorkflowLoadError(shown, "no such file")
    if path.suffix != ".py":
        raise WorkflowLoadError(shown, "a workflow must be a Python file (.py)")
    name = f"_swarm_workflow_{next(_counter)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path.resolve())
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a loader
        raise WorkflowLoadError(shown, "cannot be imported")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise WorkflowLoadError(shown, f"raised {type(exc).__name__} while importing: {exc}") from exc
    return module


def _as_workflow(obj: Any, shown: str, what: str) -> WorkflowFn:
    if inspect.isclass(obj):
        try:
            obj = obj()
        except Exception as exc:
            raise WorkflowLoadError(shown, f"cannot instantiate {what}: {type(exc).__name__}: {exc}") from exc
    fn = obj if inspect.isfunction(obj) or inspect.ismethod(obj) else getattr(obj, "run", None)
    if fn is None or not callable(fn):
        raise WorkflowLoadError(shown, f"{what} has no run(task, llm) method")
    if not inspect.iscoroutinefunction(fn):
        raise WorkflowLoadError(shown, f"{what}: run must be 'async def run(task, llm)'")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise WorkflowLoadError(shown, f"{what}: run must take two arguments (task, llm)") from None
    workflow: WorkflowFn = fn
    return workflow


def load_workflow(spec: str | Path) -> WorkflowFn:
    """Load the workflow named by ``spec`` (``path.py`` or ``path.py:Name``).

    Args:
        spec: a workflow file, optionally with ``:Name`` of a function, class or object in it.

    Returns:
        ``run`` as an async callable ``(task, llm) -> float | Result | {server: float | Result}``.

    Raises:
        WorkflowLoadError: the file is missing or fails to import; ``Name`` is not in it; no ``run``
            function and not exactly one class with an ``async def run`` method; ``run`` is not
            ``async`` or does not take ``(task, llm)``.
    """
    path, attr = _split_spec(str(spec))
    module = import_file(path)
    shown = str(path)
    if attr is not None:
        if not hasattr(module, attr):
            raise WorkflowLoadError(shown, f"defines no {attr!r}")
        return _as_workflow(getattr(module, attr), shown, attr)
    if callable(getattr(module, "run", None)):
        return _as_workflow(module.run, shown, "run")
    classes = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and obj.__module__ == module.__name__ and callable(getattr(obj, "run", None))
    ]
    if len(classes) == 1:
        return _as_workflow(classes[0], shown, classes[0].__name__)
    if classes:
        names = ", ".join(sorted(c.__name__ for c in classes))
        raise WorkflowLoadError(shown, f"several classes define run ({names}); pick one with {shown}:Name")
    raise WorkflowLoadError(shown, "defines no 'async def run(task, llm)' (nor a class with one)")
