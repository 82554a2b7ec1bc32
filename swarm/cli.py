"""``swarm``: serve a model for RL training and talk to running servers.

Commands: ``swarm serve`` (this process hosts the model), ``swarm run WORKFLOW.py`` (roll a workflow out
over a dataset against servers), ``swarm status URL`` and ``swarm top URL`` (live view). User mistakes
end with exit code 1 and one readable line, never a traceback (usage mistakes: exit code 2).
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_origin

import typer
import typer.core
from pydantic import SecretStr
from rich.console import Console
from rich.markup import escape

from swarm.client.console_script import console_app
from swarm.errors import SwarmError
from swarm.run_options import RunOptions, RunOptionsError
from swarm.serve_options import FlagOptions, ServeOptions, check_device, cli_spec

if TYPE_CHECKING:
    from rich.table import Table

    from swarm.client import RunSummary

KEEP_ALIVE_S = 75
"""Seconds an idle HTTP connection stays open (nginx's default; above httpx's 5 s pool expiry)."""


class PlainHelpCommand(typer.core.TyperCommand):
    """``swarm serve``'s command: its ``--help`` is click's plain listing (``--flag <type>  help``).

    Typer's boxed table splits each option over four name columns and cuts long flag names
    (``--max-open-episo…``) at 80 columns, and shows ``<bool>`` beside on/off flags; for a command with
    this many flags the plain listing keeps every name whole and wraps only the help text.
    """

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Write the usage, the docstring and one row per option (name and type, then wrapped help)."""
        self.rich_markup_mode = None  # without a markup mode Typer uses click's plain formatter
        super().format_help(ctx, formatter)


app = console_app(
    "swarm",
    "Serve an LLM behind an OpenAI-compatible API, record episodes token-exactly and train it with RL.",
)
console = Console(stderr=True)


def fail(message: str) -> typer.Exit:
    """Print one readable error line and return the exit to raise (the message is shown verbatim: a
    ``[extra]`` in it is text, not rich markup)."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=1)


def _parameters(model: type[FlagOptions]) -> list[inspect.Parameter]:
    """A command's Typer parameters, one per field of its options model: name, default (none: required)
    and help come from the field, the rest from its :class:`CliSpec`. On the command line a secret is
    text and a list is ``None`` when not given (Typer's repeatable option)."""
    params = []
    for name, info in model.model_fields.items():
        spec = cli_spec(info)
        kind: Any = info.annotation
        default = inspect.Parameter.empty if info.is_required() else info.default
        if kind == SecretStr | None:
            kind = str | None
        elif get_origin(kind) is list and default == []:
            kind, default = kind | None, None
        extra: dict[str, Any] = {"show_default": False} if spec.get("secret") else {}
        if "min" in spec:
            extra["min"] = spec["min"]
        if "envvar" in spec:
            extra.update(envvar=spec["envvar"], show_envvar=True)
        if spec.get("argument"):
            param: Any = typer.Argument(help=info.description)
        else:
            param = typer.Option(*spec.get("decls", ()), help=info.description, **extra)
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, param]
            )
        )
    return params


def _admin_token(given: str | None) -> str | None:
    """``--admin-token``, else env ``SWARM_ADMIN_TOKEN`` (an empty one given is a mistake: exit 1)."""
    if given is not None and not given.strip():
        raise fail("--admin-token: empty (leave it out to keep control routes open to loopback only)")
    return given or os.environ.get("SWARM_ADMIN_TOKEN")


_AdminToken = Annotated[
    str | None, typer.Option(help="Admin token (or env SWARM_ADMIN_TOKEN).", show_default=False)
]
_ServerUrl = Annotated[str, typer.Argument(help="Server root, e.g. http://127.0.0.1:8000")]


def _given(values: dict[str, Any]) -> dict[str, Any]:
    """The options given on the command line (Typer's ``None``: left out, the model's default holds)."""
    return {k: v for k, v in values.items() if v is not None}


def serve(**values: Any) -> None:
    """Host a model: OpenAI-compatible completions, episodes, control API."""
    import uvicorn

    from swarm.server.app import create_app
    from swarm.server.http_protocol import http_protocol
    from swarm.server.run_dir_lock import PRIVATE_UMASK, RunDirLock
    from swarm.server.shutdown import GRACEFUL_SHUTDOWN_S, reap_children
    from swarm.server.shutdown import run as run_server
    from swarm.server.tenants import check_tenants_on_disk

    check = values.pop("check")
    token = _admin_token(values.pop("admin_token"))
    client_tokens = values.pop("client_token") or []
    if (
        not client_tokens
        and values.get("client_tokens_file") is None
        and os.environ.get("SWARM_CLIENT_TOKEN")
    ):
        client_tokens = [os.environ["SWARM_CLIENT_TOKEN"]]
    options = ServeOptions.model_validate(
        {**_given(values), "admin_token": token, "client_token": client_tokens}
    )
    try:
        config = options.check()
        check_tenants_on_disk(config)  # a run dir's tenants need --tenants ≥ theirs, at their rank
    except SwarmError as exc:
        raise fail(str(exc)) from None
    for warning in options.warnings(config):
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    if check:  # a run dir another server holds is refused as the server itself would (read only)
        from swarm.server.run_dir_lock import held_by, in_use

        holder = held_by(config.run_dir)
        if holder is not None:
            raise fail(in_use(config.run_dir, holder))
        console.print("options are valid", highlight=False)
        return
    logging.basicConfig(
        level=options.log_level.value.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # transformers draws a "Writing model shards" bar per checkpoint: with one every step, the server's
    # log would fill with bars (its progress is in the checkpoint.saved events).
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    # Check what a user can get wrong before the slow model load, and load the model here rather than
    # in the app's lifespan, so that every mistake ends with one line instead of a startup traceback.
    host, port = config.host, config.port
    os.umask(PRIVATE_UMASK)  # the run dir's files are its owner's only (`swarm.server.run_dir_lock`)
    try:  # one server per run dir, before anything in it is read or written (`swarm.server.run_dir_lock`)
        lock = RunDirLock(config.run_dir, port)
    except SwarmError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"--run-dir {config.run_dir}: cannot lock it ({exc.strerror})") from None
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
    _check_teacher(config, engine)
    console.print(_startup_line(config, engine), highlight=False, soft_wrap=True)

    # Idle keep-alive connections outlive the clients' (httpx drops its idle ones after 5 s): with
    # uvicorn's default of 5 s both sides close at once, and a client reusing a connection as the server
    # closes it gets a ReadError.
    # The app owns the engine: its shutdown closes it. Before uvicorn re-raises a caught SIGTERM (which
    # ends the process at once) the exit hook closes it again (an app that never started, a second
    # Ctrl-C that skipped the shutdown), ends every child process (`swarm.server.shutdown`) and only
    # then releases the run dir. When the stop begins, the app ends its event streams and live chat
    # streams (`SwarmApp.begin_stop`); uvicorn waits at most GRACEFUL_SHUTDOWN_S for the other requests.
    def on_exit() -> None:
        engine.close()
        reap_children()
        lock.release()

    application = create_app(config, engine=engine, owns_engine=True)
    run_server(
        uvicorn.Config(
            application,
            http=http_protocol(config.max_header_bytes),
            h11_max_incomplete_event_size=config.max_header_bytes,  # where uvicorn's h11 protocol serves
            host=host,
            port=port,
            log_level=options.log_level.value,
            access_log=options.access_log,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        ),
        on_exit,
        on_stop=application.begin_stop,
        on_started=lock.set_port,  # the bound port, for another server's refusal (--port 0)
    )


def _check_teacher(config: Any, engine: Any) -> None:
    """With ``--teacher``: refuse a teacher with another tokenizer (exit 2) or out of reach (exit 1), in
    one line, before the server starts."""
    distill = config.training.distill
    if distill is None or not config.training.enabled:
        return
    from swarm.server.teacher import TeacherMismatch, TeacherSettings, check_teacher

    try:
        check_teacher(TeacherSettings(url=distill.teacher_url, token=config.teacher_token), engine.tokenizer)
    except TeacherMismatch as exc:
        engine.close()
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
    except SwarmError as exc:
        engine.close()
        raise fail(str(exc)) from None


_CHECK = typer.Option(
    "--check",
    help="Only validate the options and that no server holds the run dir (no model load, nothing written).",
)
serve.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        *_parameters(ServeOptions),
        inspect.Parameter(
            "check", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, _CHECK]
        ),
    ]
)
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
    if config.tenants:  # each tenant trains with its own settings; the server's are their defaults
        rank = t.trainer.lora.r if t.trainer.lora else 0
        lora = f"up to {config.tenants} LoRA tenants (r={rank}) with settings of their own, by default"
    if t.backend == "verl":
        lora += f" with verl on {t.verl.world_size} GPU(s)"
    return (
        f"{line} · trains {lora}{'' if config.tenants else ','} lr {t.trainer.lr:g}, every {t.batch.batch_size} {t.batch.policy.value} "
        f"× G={t.batch.group_size} episodes"
        + (
            " (synchronous)"
            if t.max_staleness is None
            else f" (asynchronous, max staleness {t.max_staleness})"
        )
        + (
            " · checkpoint every step"
            if t.checkpoint_every == 1
            else f" · checkpoint every {t.checkpoint_every} steps"
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
    url: _ServerUrl,
    admin_token: _AdminToken = None,
) -> None:
    """Print a server's state, policy version and episode counts (and, distilling, the teacher's; with
    LoRA tenants, each one's state and step)."""
    import time

    import httpx
    from rich.table import Table

    from swarm.client import RetryPolicy, SwarmClient

    token = _admin_token(admin_token)
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
    per_tenant = "base frozen; training is per tenant (tenants below)"
    table.add_row("policy step", per_tenant if view.training_per_tenant else str(view.step))
    table.add_row("model", view.model)
    for name, value in view.episodes.model_dump().items():
        if name != "pending_retired" or view.tenants is not None:  # a count of tenants servers only
            table.add_row(f"episodes {name}", str(value))
    table.add_row("clients", ", ".join(f"{c} ({n})" for c, n in view.clients.items()) or "-")
    if view.distill is not None:
        teacher = "ok" if view.distill.teacher_ok else "failing"
        if view.distill.last_failure_at is not None:
            ago = time.time() - view.distill.last_failure_at
            teacher += f" (last failure {ago:.0f} s ago)"
        table.add_row("teacher", teacher)
        table.add_row("episodes unscored", str(view.distill.unscored_episodes))
    if view.tenants is not None:
        t = view.tenants
        each = ", ".join(f"{b.id} {b.state.value} step {b.step}" for b in t.tenants)
        table.add_row(
            "tenants",
            f"{t.resident} of {t.cap} resident, {t.retired} retired" + (f": {each}" if each else ""),
        )
    table.add_row("run dir", view.run_dir)
    Console().print(table)


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


def run(**values: Any) -> None:
    """Roll a workflow out over a dataset: G episodes per task, N at a time; resumable (--state-dir)."""
    import asyncio

    from swarm.client import (
        AsyncSwarmClient,
        DatasetError,
        ProgressLog,
        Runner,
        RunnerError,
        TaskSet,
        WorkflowLoadError,
        load_workflow,
    )

    options = RunOptions.model_validate(_given(values))
    try:
        servers = options.check()
        fn = load_workflow(options.workflow)
        tasks = TaskSet(options.dataset, split=options.split)
        eval_tasks = (
            None if options.eval_dataset is None else TaskSet(options.eval_dataset, split=options.split)
        )
        config = options.runner_config()
    except (RunOptionsError, WorkflowLoadError, DatasetError) as exc:
        raise fail(str(exc)) from None
    if options.fresh:
        (options.state_path / ProgressLog.FILE).unlink(missing_ok=True)
    for url in servers.values():
        _reachable(url)

    async def go() -> RunSummary:
        clients = {
            name: AsyncSwarmClient(
                url,
                client_id=config.client_id,
                client_token=options.client_token or None,
                retry=Runner.default_retry(),
            )
            for name, url in servers.items()
        }
        try:
            runner = Runner(
                fn,
                clients,
                tasks,
                config,
                eval_dataset=eval_tasks,
                console=console,
                show_progress=options.progress,
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
    Console().print(_summary_table(summary, options.state_path))
    failed = summary.agent_failures + summary.infra_failures + summary.partial_finishes
    if summary.finished == 0 and failed:
        raise fail(f"no episode finished ({failed} failed; the reasons are printed above)")


run.__signature__ = inspect.Signature(_parameters(RunOptions))  # type: ignore[attr-defined]
app.command()(run)


def _summary_table(summary: RunSummary, state: Path) -> Table:
    """``swarm run``'s closing table: episode counts, rewards and the state dir."""
    from rich.table import Table

    table = Table(title="swarm run", show_header=False)
    rows = [
        ("finished", summary.finished),
        ("agent failures", summary.agent_failures),
        ("infra failures", summary.infra_failures),
        *([("partial finishes", summary.partial_finishes)] if summary.partial_finishes else []),
        *([("readiness votes", summary.votes)] if summary.votes else []),
        ("resumed (skipped)", summary.resumed),
        ("tasks done", summary.tasks_done),
        ("train reward mean", f"{summary.train_reward_mean:.4f}" if summary.train_rewards else "-"),
        *(
            (f"eval round {r} reward", f"{summary.eval_reward_mean(r):.4f}")
            for r in sorted(summary.eval_rewards)
        ),
        ("state dir", state),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    return table


@app.command()
def top(
    url: _ServerUrl,
    admin_token: _AdminToken = None,
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

    token = _admin_token(admin_token)
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
