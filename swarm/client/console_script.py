"""Running a Typer app as a console script, shared by ``swarm`` and the programs that drive swarm servers
(``a3r``): a usage mistake ends in one ``error:`` line on stderr, never click's multi-line box.

Not imported by ``swarm.client`` itself, so importing the client does not import Typer.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["run_console_script"]


def run_console_script(typer_app: typer.Typer, *, prog_name: str) -> NoReturn:
    """Run a Typer app as a console script; a usage mistake ends in one line on stderr.

    Typer draws usage errors (an unknown option, ``--max-staleness abc``) as a multi-line box; here they
    read ``error: <what is wrong> (see 'swarm serve --help')`` with click's exit code (2).

    Args:
        typer_app: The app to run on ``sys.argv``.
        prog_name: The program's name in messages (``a3r``), also when it runs as ``python -m …``, where
            click would otherwise name it after the module that was run.

    Raises:
        SystemExit: Always: the command's exit code (0 when it returns nothing), click's code for a usage
            mistake (2), or 1 when the user aborts.
    """
    console = Console(stderr=True)
    try:
        code = typer_app(standalone_mode=False, prog_name=prog_name)
    except typer.TyperException as exc:  # click's usage errors (Typer vendors click)
        if type(exc).__name__ != "NoArgsIsHelpError":  # that one has printed the help already
            ctx = getattr(exc, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            console.print(
                f"[bold red]error:[/] {escape(exc.format_message().replace('Value error, ', ''))}{escape(hint)}",
                highlight=False,
                soft_wrap=True,
            )
        sys.exit(exc.exit_code)
    except typer.Abort:
        console.print("[bold red]aborted[/]", highlight=False)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
