"""Running a Typer app as a console script, shared by ``swarm`` and the programs that drive swarm servers
(``a3r``): a usage mistake ends in one ``error:`` line on stderr, never click's multi-line box.

Not imported by ``swarm.client`` itself, so importing the client does not import Typer.
"""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["console_app", "run_console_script", "version_option"]


def version_option(prog_name: str) -> Any:
    """The eager ``--version`` option of a console script: prints ``<prog_name> <version>`` (the version
    of the ``a3r`` distribution, which ships ``swarm`` too) and exits 0 before any command runs.

    :func:`console_app` gives every app one.
    """

    def _print_version(value: bool) -> None:
        if value:
            typer.echo(f"{prog_name} {importlib.metadata.version('a3r')}")
            raise typer.Exit()

    return typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    )


def console_app(name: str, help: str, **options: Any) -> typer.Typer:
    """A Typer app built as the console scripts are: help when called without a command, no shell
    completion install, plain tracebacks, and the eager ``--version`` of :func:`version_option`.

    Args:
        name: The program's name (``swarm``, ``a3r``).
        help: The one-paragraph help shown above the commands.
        options: More ``typer.Typer`` settings (e.g. ``cls``).
    """
    app = typer.Typer(
        name=name,
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        **options,
    )

    @app.callback(help=help)
    # The option is the default, not in Annotated: annotations are strings in this module (PEP 563).
    def _options(version: bool = version_option(name)) -> None:
        del version  # handled by its eager callback

    return app


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
