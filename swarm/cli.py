"""``swarm``: serve a model for RL training and talk to running servers.

Commands: ``swarm serve`` (this process hosts the model), ``swarm status URL``. User mistakes end with
exit code 1 and one readable line, never a traceback.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from swarm.errors import SwarmError

app = typer.Typer(
    name="swarm",
    help="Serve an LLM behind an OpenAI-compatible API, record episodes token-exactly and train it with RL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)


def fail(message: str) -> typer.Exit:
    """Print one readable error line and return the exit to raise."""
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code=1)


@app.command()
def serve(
    model: Annotated[
        str | None,
        typer.Option(
            help="Local HF model directory or .gguf file (default: embedded SmolLM2-135M-Instruct)."
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0 picks a free one).")] = 8000,
    run_dir: Annotated[
        Path, typer.Option(help="Pool database, checkpoints, metrics and logs; reuse it to resume.")
    ] = Path("runs/default"),
    admin_token: Annotated[
        str | None,
        typer.Option(help="Bearer token for control routes (or env SWARM_ADMIN_TOKEN).", show_default=False),
    ] = None,
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16")] = "float32",
    device: Annotated[str, typer.Option(help="torch device, e.g. cpu or cuda")] = "cpu",
    max_batch_size: Annotated[int, typer.Option(help="Most sequences sampled together.")] = 32,
    episode_timeout: Annotated[
        float, typer.Option(help="Reclaim open episodes idle this many seconds.")
    ] = 600.0,
    log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
) -> None:
    """Host a model: OpenAI-compatible completions, episodes, control API."""
    import uvicorn
    from pydantic import SecretStr, ValidationError

    from swarm.config import ServerConfig
    from swarm.server.app import create_app

    token = admin_token or os.environ.get("SWARM_ADMIN_TOKEN")
    try:
        config = ServerConfig(
            model=model,
            host=host,
            port=port,
            run_dir=run_dir,
            admin_token=SecretStr(token) if token else None,
            dtype=dtype,  # type: ignore[arg-type]
            device=device,
            max_batch_size=max_batch_size,
            episode_timeout_s=episode_timeout,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        raise fail(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}") from None
    if model is not None and not Path(model).expanduser().exists():
        raise fail(f"--model {model}: no such file or directory")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        uvicorn.run(create_app(config), host=host, port=port, log_level=log_level.lower())
    except SwarmError as exc:
        raise fail(str(exc)) from None


@app.command()
def status(
    url: Annotated[str, typer.Argument(help="Server root, e.g. http://127.0.0.1:8000")],
    admin_token: Annotated[
        str | None, typer.Option(help="Admin token (or env SWARM_ADMIN_TOKEN).", show_default=False)
    ] = None,
) -> None:
    """Print a server's state, policy version and episode counts."""
    import httpx
    from rich.table import Table

    from swarm.client import RetryPolicy, SwarmClient

    token = admin_token or os.environ.get("SWARM_ADMIN_TOKEN")
    try:
        with SwarmClient(url, admin_token=token, retry=RetryPolicy(attempts=2, deadline_s=10)) as client:
            view = client.status()
    except httpx.TransportError as exc:
        raise fail(f"cannot reach {url}: {exc}") from None
    except SwarmError as exc:
        raise fail(str(exc)) from None
    table = Table(title=f"swarm server {url}", show_header=False)
    table.add_row("state", view.state.value)
    table.add_row("policy step", str(view.step))
    table.add_row("model", view.model)
    for name, value in view.episodes.model_dump().items():
        table.add_row(f"episodes {name}", str(value))
    table.add_row("clients", ", ".join(f"{c} ({n})" for c, n in view.clients.items()) or "-")
    table.add_row("run dir", view.run_dir)
    Console().print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
