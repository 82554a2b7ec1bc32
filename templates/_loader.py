"""Import the modules of a template folder, whether it is the installed package or a rendered copy.

A workflow file is loaded by path by the swarm runner (as a top-level module, with no package), so it
cannot use relative imports. :func:`import_sibling` gives it its neighbours: inside the installed
package it imports ``templates.<name>.<module>`` normally; for a rendered folder it registers the folder
once as a synthetic package (named after a hash of its absolute path, so two rendered copies never
share modules) and imports the module from it. Modules other than ``workflow.py`` can then use plain
relative imports (``from .parsing import parse_vote``) in both cases.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _fingerprint(folder: Path) -> tuple[tuple[str, int, int], ...]:
    stats = ((p.name, p.stat()) for p in sorted(folder.glob("*.py")))
    return tuple((name, st.st_mtime_ns, st.st_size) for name, st in stats)


def folder_package(folder: str | Path) -> str:
    """Register ``folder`` as an importable package and return its module name.

    When a ``.py`` file of the folder changed since the modules were imported (an applied patch), the
    cached modules are dropped so the next import reads the current code, matching the runner, which
    imports the workflow file afresh on each load.

    Args:
        folder: A directory holding template modules (need not contain ``__init__.py``).

    Returns:
        The package name, ``_a3r_template_<12 hex digits>`` (stable for the same absolute path).
    """
    path = Path(folder).resolve()
    name = "_a3r_template_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    fingerprint = _fingerprint(path)
    package = sys.modules.get(name)
    if package is not None and getattr(package, "__a3r_fingerprint__", None) != fingerprint:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        package = None
    if package is None:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(path)]
        package = importlib.util.module_from_spec(spec)
        package.__a3r_fingerprint__ = fingerprint  # type: ignore[attr-defined]
        sys.modules[name] = package
    return name


def import_sibling(module_name: str, module_file: str, sibling: str) -> ModuleType:
    """Import the module ``sibling`` that lives in the same folder as the calling module.

    Args:
        module_name: The caller's ``__name__``.
        module_file: The caller's ``__file__``.
        sibling: Module name without ``.py`` (e.g. ``"reward"``).

    Returns:
        The imported module (cached in ``sys.modules`` as usual).

    Raises:
        ModuleNotFoundError: There is no ``<sibling>.py`` next to the caller.
    """
    package, _, _ = module_name.rpartition(".")
    folder = Path(module_file).resolve().parent
    parent = sys.modules.get(package) if package else None
    search = getattr(parent, "__path__", None) or []
    if not any(Path(entry).resolve() == folder for entry in search):
        # Loaded by path (no package, or a package name that is not this folder): use a synthetic one.
        package = folder_package(folder)
    return importlib.import_module(f"{package}.{sibling}")


def load_module(folder: str | Path, module: str) -> ModuleType:
    """Import ``<folder>/<module>.py`` as part of the folder's synthetic package (see :func:`folder_package`)."""
    return importlib.import_module(f"{folder_package(folder)}.{module}")
