"""``swarm``: serve a model for RL training and talk to running servers.

Commands: ``swarm serve`` (this process hosts the model), ``swarm run WORKFLOW.py`` (roll a workflow out
over a dataset against servers), ``swarm status URL`` and ``swarm top URL`` (live view). User mistakes
end with exit code 1 and one readable line, never a traceback (usage mistakes: exit code 2).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
import os
import socket
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from swarm.errors import SwarmError
from swarm.serve_options import PlainHelpCommand, ServeOptions, check_device

KEEP_ALIVE_S = 75
"""Seconds an idle HTTP connection stays open (nginx's default; above httpx's 5 s pool expiry)."""

app = typer.Typer(
    name="swarm",
    help="Serve an LLM behind an OpenAI-compatible API, record episodes token-exactly and train it with RL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:  # swarm ships in the a3r distribution
        typer.echo(f"swarm {importlib.metadata.version('a3r')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Serve an LLM behind an OpenAI-compatible API, record episodes token-exactly and train it with RL."""


def fail(message: str) -> typer.Exit:
    """Print one readable error line and return the exit to raise (the message is shown verbatim: a
    ``[extra]`` in it is text, not rich markup)."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=1)


def _serve_parameters() -> list[inspect.Parameter]:
    """``swarm serve``'s Typer parameters, one per :class:`ServeOptions` field (name, default and help
    come from the model), then ``--check``."""
    params = []
    for name, info in ServeOptions.model_fields.items():
        kind: Any = info.annotation
        default = info.default
        extra: dict[str, Any] = {}
        if name == "admin_token":  # a secret: typed as text here, never shown as a default
            kind, extra["show_default"] = str | None, False
        elif name == "quota":
            kind, default = list[str] | None, None
        elif name == "client_token":  # secrets: never shown as a default
            kind, default, extra["show_default"] = list[str] | None, None, False
        elif name == "lora_rank":
            extra["min"] = 0
        decls = ("--train/--no-train",) if name == "train" else ()
        option = typer.Option(*decls, help=info.description, **extra)
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, option]
            )
        )
    check = typer.Option("--check", help="Only validate the options (no model load, nothing written).")
    params.append(
        inspect.Parameter(
            "check", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, check]
        )
    )
    return params


def serve(**values: Any) -> None:
    """Host a model: OpenAI-compatible completions, episodes, control API."""
    import uvicorn

    from swarm.server.app import create_app
    from swarm.server.http_protocol import http_protocol

    check = values.pop("check")
    token = values.pop("admin_token")
    if token is not None and not token.strip():
        raise fail("--admin-token: empty (leave it out to keep control routes open to loopback only)")
    token = token or os.environ.get("SWARM_ADMIN_TOKEN")
    client_tokens = values.pop("client_token") or []
    if (
        not client_tokens
        and values.get("client_tokens_file") is None
        and os.environ.get("SWARM_CLIENT_TOKEN")
    ):
        client_tokens = [os.environ["SWARM_CLIENT_TOKEN"]]
    options = ServeOptions.model_validate(
        {
            **{k: v for k, v in values.items() if v is not None},
            "admin_token": token,
            "client_token": client_tokens,
        }
    )
    try:
        config = options.check()
    except SwarmError as exc:
        raise fail(str(exc)) from None
    if check:
        console.print("options are valid", highlight=False)
        return
    logging.basicConfig(
        level=options.log_level.value.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Check what a user can get wrong before the slow model load, and load the model here rather than
    # in the app's lifespan, so that every mistake ends with one line instead of a startup traceback.
    host, port = config.host, config.port
    if port:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                probe.bind((host, port))
            except OSError as exc:
                raise fail(f"--host {host} --port {port}: cannot listen there ({exc.strerror})") from None
    try:
        engine = _load_engine(config)
    except SwarmError as exc:
        raise fail(str(exc)) from None
    console.print(_startup_line(config, engine), highlight=False, soft_wrap=True)
    # Idle keep-alive connections outlive the clients' (httpx drops its idle ones after 5 s): with
    # uvicorn's default of 5 s both sides close at once, and a client reusing a connection as the server
    # closes it gets a ReadError.
    # The app owns the engine: its shutdown closes it, before uvicorn re-raises a caught SIGTERM (which
    # ends the process at once); the `finally` covers an app that never started.
    try:
        uvicorn.run(
            create_app(config, engine=engine, owns_engine=True),
            http=http_protocol(),
            host=host,
            port=port,
            log_level=options.log_level.value,
            access_log=options.access_log,
            timeout_keep_alive=KEEP_ALIVE_S,
        )
    finally:
        engine.close()


serve.__signature__ = inspect.Signature(_serve_parameters())  # type: ignore[attr-defined]
app.command(cls=PlainHelpCommand)(serve)


def _startup_line(config: Any, engine: Any) -> str:
    """One line saying what this server is: model, engine, weights and compute dtype, device, training,
    run dir (from the configuration and the `Engine` protocol only)."""
    from swarm.precision import resolve_mixed_precision

    if config.engine == "vllm":
        where = f"vllm, {config.gpu_memory_utilization:g} of the GPU, trainer on {config.device}"
    else:
        compute = resolve_mixed_precision(config.mixed_precision, config.device).value
        where = f"hf, compute {compute}, {config.device}"
    line = f"serving {engine.model_name} ({config.weights_dtype} weights, {where}) · run dir {config.run_dir}"
    t = config.training
    if not t.enabled:
        return line + " · training off" + _credentials_clause(config)
    lora = f"LoRA r={t.trainer.lora.r}" if t.trainer.lora else "full fine-tuning"
    if t.backend == "verl":
        lora += f" with verl on {t.verl.world_size} GPU(s)"
    return (
        f"{line} · trains {lora}, lr {t.trainer.lr:g}, every {t.batch.batch_size} {t.batch.policy.value} "
        f"× G={t.batch.group_size} episodes"
        + (
            " (synchronous)"
            if t.max_staleness is None
            else f" (asynchronous, max staleness {t.max_staleness})"
        )
        + _credentials_clause(config)
    )


def _credentials_clause(config: Any) -> str:
    """`` · control routes … · episodes …``: which credentials this server asks for (never their values)."""
    control = "need the admin token" if config.admin_token else "open on loopback (no admin token)"
    tokens = len(config.client_tokens)
    episodes = f"need one of {tokens} client token(s)" if tokens else "need no client token"
    return f" · control routes {control} · episodes {episodes}"


def _load_engine(config: Any) -> Any:
    """Resolve, load and wrap the model (raises ModelLoadError / ConfigError on user mistakes)."""
    import torch

    from swarm.engine.factory import load_engine

    check_device(config.device)
    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    return load_engine(config)


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

    if admin_token is not None and not admin_token.strip():
        raise fail("--admin-token: empty (leave it out to keep control routes open to loopback only)")
    token = admin_token or os.environ.get("SWARM_ADMIN_TOKEN")
    try:
        with SwarmClient(url, admin_token=token, retry=RetryPolicy(attempts=2, deadline_s=10)) as client:
            view = client.status()
    except httpx.TransportError as exc:
        raise fail(f"cannot reach {url}: {exc}") from None
    except SwarmError as exc:
        hint = ""
        if getattr(exc, "status_code", None) in (401, 403):
            hint = (
                " (pass --admin-token or set SWARM_ADMIN_TOKEN; servers started by a3r keep a generated "
                "token in memory: watch those with `a3r tui`)"
            )
        raise fail(f"{exc}{hint}") from None
    table = Table(title=f"swarm server {url}", show_header=False)
    table.add_row("state", view.state.value)
    table.add_row("policy step", str(view.step))
    table.add_row("model", view.model)
    for name, value in view.episodes.model_dump().items():
        table.add_row(f"episodes {name}", str(value))
    table.add_row("clients", ", ".join(f"{c} ({n})" for c, n in view.clients.items()) or "-")
    table.add_row("run dir", view.run_dir)
    Console().print(table)


def _parse_servers(servers: list[str]) -> dict[str, str]:
    """``URL`` (one server, named ``default``) or ``NAME=URL`` per server (multi-model)."""
    parsed: dict[str, str] = {}
    for spec in servers:
        name, sep, url = spec.partition("=")
        if not sep:
            name, url = "default", spec
        if not url.startswith(("http://", "https://")):
            raise fail(f"--server {spec}: expected URL or NAME=URL with an http(s):// URL")
        if name in parsed:
            raise fail(f"--server {spec}: the name {name!r} is given twice (use NAME=URL for each server)")
        parsed[name] = url
    if "default" in parsed and len(parsed) > 1:
        raise fail("--server: name every server (NAME=URL) when there are several")
    return parsed


def _reachable(url: str) -> None:
    """Fail with one line when nothing answers HTTP at ``url`` (any answer, even 404, is fine)."""
    import httpx

    for attempt in range(3):
        try:
            httpx.get(url.rstrip("/") + "/v1/models", timeout=5.0)
            return
        except httpx.TransportError as exc:
            error = exc
        if attempt < 2:
            import time

            time.sleep(1.0)
    raise fail(f"cannot reach {url}: {type(error).__name__}: {error}")


_RUN_OPTIONS = {
    "heartbeat_s": "heartbeat",
    "episode_timeout_s": "episode-timeout",
    "trainable_agents": "trainable-agent",
}
"""`RunnerConfig` fields whose ``swarm run`` option has another name."""


@app.command()
def run(
    workflow: Annotated[
        str, typer.Argument(help="Workflow file (async def run(task, llm)), or FILE.py:Name.")
    ],
    server: Annotated[
        list[str],
        typer.Option(help="Server URL; repeat as NAME=URL for multi-model workflows (llm is then a dict)."),
    ],
    dataset: Annotated[
        str, typer.Option(help="Tasks: JSONL file, saved HF dataset dir, or FILE.py:function.")
    ],
    group_size: Annotated[int, typer.Option(help="G: episodes per task (one GRPO group).")] = 4,
    concurrency: Annotated[int, typer.Option(help="N: most episodes at once.")] = 8,
    epochs: Annotated[int, typer.Option(help="Passes over the dataset.")] = 1,
    max_tasks: Annotated[int | None, typer.Option(help="Use only the first M tasks.")] = None,
    split: Annotated[str | None, typer.Option(help="Split of a saved HF DatasetDict.")] = None,
    eval_dataset: Annotated[str | None, typer.Option(help="Eval tasks (same formats as --dataset).")] = None,
    eval_every: Annotated[int | None, typer.Option(help="Eval round after every K train tasks.")] = None,
    eval_group_size: Annotated[int, typer.Option(help="Episodes per eval task.")] = 1,
    family: Annotated[str | None, typer.Option(help="Task family for cocktail quotas.")] = None,
    trainable_agent: Annotated[
        list[str] | None, typer.Option(help="Agent whose calls are trained (repeat; default: all).")
    ] = None,
    client_id: Annotated[
        str | None, typer.Option(help="Client id (default: runner-<workflow name>).")
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option(help="Resume file folder (default: .swarm/runs/<workflow name>).")
    ] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Forget earlier progress in the state dir.")] = False,
    rerun_aborted: Annotated[
        bool, typer.Option("--rerun-aborted", help="Resume: run again the episodes the workflow failed.")
    ] = False,
    heartbeat: Annotated[float, typer.Option(help="Seconds between heartbeats of a running episode.")] = 30.0,
    episode_timeout: Annotated[
        float | None,
        typer.Option(help="Seconds a workflow may run; then its episode is aborted and re-run (infra)."),
    ] = None,
    infra_retries: Annotated[int, typer.Option(help="Re-runs of an infra-failed episode.")] = 2,
    vote_every: Annotated[
        int | None,
        typer.Option(
            help="Voting batch policies: vote ready after every K train tasks (a round), heartbeat the "
            "client, and leave at the end."
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Draw the live progress bar.")] = True,
    client_token: Annotated[
        str | None,
        typer.Option(
            envvar="SWARM_CLIENT_TOKEN",
            show_envvar=True,
            show_default=False,
            help="Client token of servers started with --client-token.",
        ),
    ] = None,
) -> None:
    """Roll a workflow out over a dataset: G episodes per task, N at a time; resumable (--state-dir)."""
    import asyncio

    from pydantic import ValidationError
    from rich.table import Table

    from swarm.client import (
        AsyncSwarmClient,
        DatasetError,
        ProgressLog,
        Runner,
        RunnerConfig,
        RunnerError,
        TaskSet,
        WorkflowLoadError,
        load_workflow,
    )

    servers = _parse_servers(server)
    if eval_every is not None and eval_dataset is None:
        raise fail("--eval-every needs --eval-dataset")
    try:
        fn = load_workflow(workflow)
        tasks = TaskSet(dataset, split=split)
        eval_tasks = TaskSet(eval_dataset, split=split) if eval_dataset is not None else None
    except (WorkflowLoadError, DatasetError) as exc:
        raise fail(str(exc)) from None
    stem = Path(workflow.split(":")[0]).stem
    state = state_dir if state_dir is not None else Path(".swarm") / "runs" / stem
    if fresh:
        (state / ProgressLog.FILE).unlink(missing_ok=True)
    try:
        config = RunnerConfig(
            group_size=group_size,
            concurrency=concurrency,
            epochs=epochs,
            max_tasks=max_tasks,
            eval_every=eval_every,
            eval_group_size=eval_group_size,
            family=family,
            trainable_agents=trainable_agent or None,
            client_id=client_id or f"runner-{stem}",
            heartbeat_s=heartbeat,
            episode_timeout_s=episode_timeout,
            infra_retries=infra_retries,
            vote_every=vote_every,
            state_dir=state,
            rerun_aborted=rerun_aborted,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0])
        option = _RUN_OPTIONS.get(field, field.replace("_", "-"))
        raise fail(f"--{option}: {err['msg']}") from None

    for url in servers.values():
        _reachable(url)

    async def go() -> Any:
        clients = {
            name: AsyncSwarmClient(
                url,
                client_id=config.client_id,
                client_token=client_token or None,
                retry=Runner.default_retry(),
            )
            for name, url in servers.items()
        }
        try:
            runner = Runner(
                fn, clients, tasks, config, eval_dataset=eval_tasks, console=console, show_progress=progress
            )
            return await runner.run()
        finally:
            for c in clients.values():
                await c.aclose()

    try:
        summary = asyncio.run(go())
    except (RunnerError, DatasetError) as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:  # Ctrl-C, or a supervisor (a3r) stopping the client: not an error
        console.print("stopped: interrupted; run the same command again to resume", highlight=False)
        raise typer.Exit(code=130) from None
    table = Table(title="swarm run", show_header=False)
    table.add_row("finished", str(summary.finished))
    table.add_row("agent failures", str(summary.agent_failures))
    table.add_row("infra failures", str(summary.infra_failures))
    if summary.partial_finishes:
        table.add_row("partial finishes", str(summary.partial_finishes))
    if summary.votes:
        table.add_row("readiness votes", str(summary.votes))
    table.add_row("resumed (skipped)", str(summary.resumed))
    table.add_row("tasks done", str(summary.tasks_done))
    table.add_row("train reward mean", f"{summary.train_reward_mean:.4f}" if summary.train_rewards else "-")
    for round_ in sorted(summary.eval_rewards):
        table.add_row(f"eval round {round_} reward", f"{summary.eval_reward_mean(round_):.4f}")
    table.add_row("state dir", str(state))
    Console().print(table)
    failed = summary.agent_failures + summary.infra_failures + summary.partial_finishes
    if summary.finished == 0 and failed:
        raise fail(f"no episode finished ({failed} failed; the reasons are printed above)")


@app.command()
def top(
    url: Annotated[str, typer.Argument(help="Server root, e.g. http://127.0.0.1:8000")],
    admin_token: Annotated[
        str | None, typer.Option(help="Admin token (or env SWARM_ADMIN_TOKEN).", show_default=False)
    ] = None,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
    once: Annotated[
        bool, typer.Option("--once", help="Print one frame and exit (the default when not on a terminal).")
    ] = False,
) -> None:
    """Live view of a server: state, policy step, pool, clients and the reward curve."""
    import time

    from rich.live import Live

    from swarm.client import RetryPolicy, SwarmClient
    from swarm.client._dashboard import poll, render

    if admin_token is not None and not admin_token.strip():
        raise fail("--admin-token: empty (leave it out to keep control routes open to loopback only)")
    token = admin_token or os.environ.get("SWARM_ADMIN_TOKEN")
    out = Console()
    retry = RetryPolicy(attempts=1, deadline_s=5)
    with SwarmClient(url, admin_token=token, retry=retry, timeout_s=5.0) as client:
        if once or not out.is_terminal:  # a live view redraws in place: nothing would reach a pipe or file
            snap = poll(client)
            if snap.status is None:
                raise fail(snap.error or f"no answer from {url}")
            out.print(render(url, snap))
            return
        try:
            with Live(render(url, poll(client)), console=out, refresh_per_second=4, screen=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(render(url, poll(client)))
        except KeyboardInterrupt:
            return


def main() -> None:
    """Entry point of the ``swarm`` console script."""
    from swarm.client.console_script import run_console_script  # as in the commands: the client loads late

    run_console_script(app, prog_name="swarm")


if __name__ == "__main__":
    main()
