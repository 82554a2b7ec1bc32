"""Writing a data builder's tasks: the JSONL file and the command line every template's ``data.py`` has.

A template's ``build(**data_params)`` returns task dicts; :func:`write_jsonl` writes them one a line and
:func:`main` is the ``python data.py --out tasks.jsonl [--option value]...`` entry point built from the
builder's signature (one option per parameter, with its default).
"""

from __future__ import annotations

import argparse
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def write_jsonl(tasks: list[dict[str, Any]], path: str | Path) -> None:
    """Write one JSON object per line (UTF-8, non-ASCII characters kept as they are)."""
    with open(path, "w", encoding="utf-8") as f:
        for task in tasks:
            f.write(json.dumps(task, ensure_ascii=False) + "\n")


def main(
    doc: str,
    build: Callable[..., list[dict[str, Any]]],
    argv: list[str] | None,
    choices: Mapping[str, Sequence[Any]] | None = None,
) -> None:
    """Parse ``--out`` and one option per parameter of ``build`` (``n_tasks`` as ``--n-tasks``, its
    default and type from the signature) from ``argv`` (the process's arguments when ``None``), call
    ``build`` with them and write its tasks to ``--out``.

    Args:
        doc: The data module's docstring; its first line is the help text.
        build: The template's builder; every parameter has a default (an int, float or str).
        argv: Arguments without the program name.
        choices: Allowed values of some parameters, by name.

    Raises:
        SystemExit: Unknown or invalid arguments (argparse's message and exit status 2).
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", required=True)
    for name, parameter in inspect.signature(build).parameters.items():
        default = parameter.default
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=type(default),
            default=default,
            choices=(choices or {}).get(name),
        )
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    write_jsonl(build(**args), out)
