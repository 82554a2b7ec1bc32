"""``swarm``: serve a model for RL training and talk to running servers.

Commands: ``swarm serve`` (this process hosts the model), ``swarm run WORKFLOW.py`` (roll a workflow out
over a dataset against servers), ``swarm status URL`` and ``swarm top URL`` (live view). User mistakes
end with exit code 1 and one readable line, never a traceback (usage mistakes: exit code 2).
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

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
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=1)


def _training_config(
    path: Path | None,
    enabled: bool,
    policy: str,
    batch_size: int,
    group_size: int,
    lr: float,
    lora_rank: int,
    kl_coef: float,
    tis_cap: float | None,
    micro_batch_size: int,
    checkpoint_every: int,
    max_steps: int | None,
    drain_timeout: float,
    max_staleness: int | None,
    quotas: list[str],
) -> Any:
    """Build the TrainingConfig from a JSON file or from the CLI options (ValueError on bad input)."""
    from swarm.config import TrainingConfig

    if path is not None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"--training-config {path}: {exc.strerror}") from None
        return TrainingConfig.model_validate_json(text)
    shares: dict[str, float] = {}
    for item in quotas:
        family, sep, share = item.partition("=")
        if not sep or not family:
            raise ValueError(f"--quota {item!r}: expected FAMILY=SHARE, e.g. math=0.4")
        if family in shares:
            raise ValueError(f"--quota {item!r}: family {family!r} is given twice")
        try:
            shares[family] = float(share)
        except ValueError:
            raise ValueError(f"--quota {item!r}: {share!r} is not a number") from None
    trainer: dict[str, Any] = {
        "lr": lr,
        "kl_coef": kl_coef,
        "tis_cap": tis_cap,
        "micro_batch_size": micro_batch_size,
    }
    if lora_rank > 0:
        trainer["lora"] = {"r": lora_rank, "alpha": 2 * lora_rank}
    return TrainingConfig.model_validate(
        {
            "enabled": enabled,
            "batch": {"policy": policy, "batch_size": batch_size, "group_size": group_size},
            "trainer": trainer,
            "quotas": {"shares": shares, "slack": group_size} if shares else None,
            "checkpoint_every": checkpoint_every,
            "max_steps": max_steps,
            "drain_timeout_s": drain_timeout,
            "max_staleness": max_staleness,
        }
    )


class LogLevel(enum.StrEnum):
    """``swarm serve --log-level``."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


_SERVE_OPTIONS: dict[tuple[str, ...], str] = {
    ("torch_threads",): "--threads",
    ("episode_timeout_s",): "--episode-timeout",
    ("training", "batch"): "--batch-policy/--batch-size/--group-size",  # BatchConfig's cross-field checks
    ("training", "batch", "policy"): "--batch-policy",
    ("training", "batch", "batch_size"): "--batch-size",
    ("training", "batch", "group_size"): "--group-size",
    ("training", "trainer", "lr"): "--lr",
    ("training", "trainer", "kl_coef"): "--kl-coef",
    ("training", "trainer", "tis_cap"): "--tis-cap",
    ("training", "trainer", "micro_batch_size"): "--micro-batch-size",
    ("training", "trainer", "lora", "r"): "--lora-rank",
    ("training", "trainer"): "--lr/--lora-rank/--kl-coef/--tis-cap/--micro-batch-size",
    ("training", "checkpoint_every"): "--checkpoint-every",
    ("training", "max_steps"): "--max-steps",
    ("training", "drain_timeout_s"): "--drain-timeout",
    ("training", "max_staleness"): "--max-staleness",
    ("training", "quotas"): "--quota",
    ("training", "quotas", "shares"): "--quota",
}
"""Where a `ServerConfig` validation error points, as the ``swarm serve`` option to fix."""


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
    dtype: Annotated[
        str,
        typer.Option(
            help="Weights: float32 | bfloat16 | float16 | auto (bf16 for LoRA where fast); full FT needs float32."
        ),
    ] = "float32",
    mixed_precision: Annotated[
        str,
        typer.Option(help="Compute: no (float32-exact logprobs) | bf16 | fp16 | auto (bf16 where fast)."),
    ] = "no",
    device: Annotated[str, typer.Option(help="torch device, e.g. cpu or cuda")] = "cpu",
    max_batch_size: Annotated[int, typer.Option(help="Most sequences sampled together.")] = 32,
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads (default: one per core; 1 on a shared machine).")
    ] = None,
    episode_timeout: Annotated[
        float, typer.Option(help="Reclaim open episodes idle this many seconds.")
    ] = 600.0,
    train: Annotated[
        bool, typer.Option("--train/--no-train", help="Train on pooled episodes (or only serve and record).")
    ] = True,
    batch_policy: Annotated[
        str, typer.Option(help="episodes | tasks | informative_tasks | all_clients_ready | any_client_ready")
    ] = "tasks",
    batch_size: Annotated[
        int, typer.Option(help="B: groups (tasks) per step, or episodes/G for the episodes policy.")
    ] = 8,
    group_size: Annotated[int, typer.Option(help="G: episodes per task (GRPO group).")] = 8,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-5,
    lora_rank: Annotated[int, typer.Option(min=0, help="LoRA rank; 0 trains all weights.")] = 0,
    kl_coef: Annotated[float, typer.Option(help="β of the KL penalty to the reference policy.")] = 0.0,
    tis_cap: Annotated[
        float | None,
        typer.Option(
            help="C of truncated importance sampling min(π_old/μ, C) against sampler mismatch (off)."
        ),
    ] = None,
    micro_batch_size: Annotated[int, typer.Option(help="Sequences per forward/backward pass.")] = 4,
    checkpoint_every: Annotated[int, typer.Option(help="Save a checkpoint every N steps.")] = 5,
    max_steps: Annotated[int | None, typer.Option(help="Stop training after N steps (keep serving).")] = None,
    drain_timeout: Annotated[
        float, typer.Option(help="Seconds open episodes may finish once a batch is ready.")
    ] = 120.0,
    max_staleness: Annotated[
        int | None,
        typer.Option(
            help="Asynchronous training: no drain; episodes admitted during steps while at most "
            "(K+1)·B·G are ahead of the trainer; open episodes K versions behind are aborted "
            "(pair with --tis-cap). Default: synchronous."
        ),
    ] = None,
    quota: Annotated[
        list[str] | None, typer.Option(help="Family share, repeatable: --quota math=0.4 --quota code=0.6")
    ] = None,
    training_config: Annotated[
        Path | None, typer.Option(help="JSON file with a full TrainingConfig (overrides the options above).")
    ] = None,
    log_level: Annotated[LogLevel, typer.Option(help="Server log level.")] = LogLevel.info,
    check: Annotated[
        bool, typer.Option("--check", help="Only validate the options (no model load, nothing written).")
    ] = False,
) -> None:
    """Host a model: OpenAI-compatible completions, episodes, control API."""
    import uvicorn
    from pydantic import SecretStr, ValidationError

    from swarm.config import ServerConfig
    from swarm.server.app import create_app

    if admin_token is not None and not admin_token.strip():
        raise fail("--admin-token: empty (leave it out to keep control routes open to loopback only)")
    token = admin_token or os.environ.get("SWARM_ADMIN_TOKEN")
    try:
        config = ServerConfig(
            model=model,
            host=host,
            port=port,
            run_dir=run_dir,
            admin_token=SecretStr(token) if token else None,
            dtype=dtype,  # type: ignore[arg-type]
            mixed_precision=mixed_precision,  # type: ignore[arg-type]
            device=device,
            max_batch_size=max_batch_size,
            torch_threads=threads,
            episode_timeout_s=episode_timeout,
            training=_training_config(
                training_config,
                train,
                batch_policy,
                batch_size,
                group_size,
                lr,
                lora_rank,
                kl_coef,
                tis_cap,
                micro_batch_size,
                checkpoint_every,
                max_steps,
                drain_timeout,
                max_staleness,
                quota or [],
            ),
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(str(p) for p in err["loc"])
        if exc.title == "TrainingConfig":  # validated on its own, before the ServerConfig around it
            loc = ("training", *loc)
        where = ".".join(loc)
        if training_config is not None and loc[:1] == ("training",):
            where = f"--training-config {training_config}: {'.'.join(loc[1:])}"
        elif loc in _SERVE_OPTIONS:
            where = _SERVE_OPTIONS[loc]
        elif len(loc) == 1:  # a top-level field is a command-line option
            where = "--" + where.replace("_", "-")
        message = str(err["msg"]).removeprefix("Value error, ")
        raise fail(f"{where}: {message}" if where else message) from None
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    if model is not None:
        from swarm.engine.model_loading import check_model_path

        try:
            check_model_path(model)
        except SwarmError as exc:
            raise fail(f"--model {exc}") from None
    try:
        _check_device(device)
    except SwarmError as exc:
        raise fail(str(exc)) from None
    _check_run_dir(run_dir)
    if check:
        console.print("options are valid", highlight=False)
        return
    logging.basicConfig(
        level=log_level.value.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Check what a user can get wrong before the slow model load, and load the model here rather than
    # in the app's lifespan, so that every mistake ends with one line instead of a startup traceback.
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
    uvicorn.run(create_app(config, engine=engine), host=host, port=port, log_level=log_level.value)


def _startup_line(config: Any, engine: Any) -> str:
    """One line saying what this server is: model, weights and compute dtype, device, training, run dir."""
    weights = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
    line = (
        f"serving {engine.model_name} ({weights} weights, compute {engine.mixed_precision.value}, "
        f"{config.device}) · run dir {config.run_dir}"
    )
    t = config.training
    if not t.enabled:
        return line + " · training off"
    lora = f"LoRA r={t.trainer.lora.r}" if t.trainer.lora else "full fine-tuning"
    return (
        f"{line} · trains {lora}, lr {t.trainer.lr:g}, every {t.batch.batch_size} {t.batch.policy.value} "
        f"× G={t.batch.group_size} episodes"
        + (
            " (synchronous)"
            if t.max_staleness is None
            else f" (asynchronous, max staleness {t.max_staleness})"
        )
        + " · control routes "
        + ("need the admin token" if config.admin_token else "open on loopback (no admin token)")
    )


def _check_run_dir(run_dir: Path) -> None:
    """Fail in one line unless ``run_dir`` is a folder, or can become one, that this user can write."""
    path = run_dir.expanduser()
    if path.exists() and not path.is_dir():
        raise fail(f"--run-dir {run_dir}: exists and is not a folder")
    parent = path if path.exists() else next((p for p in path.parents if p.exists()), Path("."))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise fail(f"--run-dir {run_dir}: {parent} is not a folder this user can write to")


def _check_device(device: str) -> None:
    """Raise ConfigError unless ``device`` names a torch device this process can use."""
    import torch

    from swarm.errors import ConfigError

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"--device {device}: not a torch device (e.g. cpu, cuda, cuda:1, mps)") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"--device {device}: this torch build sees no CUDA device")
        if parsed.index is not None and parsed.index >= count:
            raise ConfigError(
                f"--device {device}: only {count} CUDA device(s) visible (cuda:0…cuda:{count - 1})"
            )
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device}: MPS is not available here")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {device}: the hf engine runs on cpu, cuda or mps")


def _load_engine(config: Any) -> Any:
    """Resolve, load and wrap the model (raises ModelLoadError / ConfigError on user mistakes)."""
    import torch

    from swarm.engine.factory import load_engine

    _check_device(config.device)
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
    progress: Annotated[bool, typer.Option(help="Draw the live progress bar.")] = True,
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
            name: AsyncSwarmClient(url, client_id=config.client_id, retry=Runner.default_retry())
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


def run_console_script(typer_app: typer.Typer) -> NoReturn:
    """Run a Typer app as a console script; a usage mistake ends in one line on stderr.

    Typer draws usage errors (an unknown option, ``--max-staleness abc``) as a multi-line box; here they
    read ``error: <what is wrong> (see 'swarm serve --help')`` with click's exit code (2).
    """
    try:
        code = typer_app(standalone_mode=False)
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


def main() -> None:
    run_console_script(app)


if __name__ == "__main__":
    main()
