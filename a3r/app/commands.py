"""The research commands of the ``a3r`` CLI: ``vibe``, ``research`` and ``resume``.

| command | what it does |
|---|---|
| ``a3r vibe "train who-is-the-spy"`` | plan → code → smoke episode → training → monitoring → (patch → approval → client hot-swap) → report |
| ``a3r research "find min stable batch size on AIME"`` | plan with an operational definition → preflight baseline → staged sweep (≥ 2 seeds) → findings and report |
| ``a3r resume THREAD`` | continue a thread after a crash, or decide its pending patch (``--approve``/``--reject``) |

A pending patch is shown as a diff and decided at the prompt on a terminal; elsewhere the command prints
how to resume and exits 0 (``--wait`` polls the store for a decision taken in ``a3r tui`` instead).
User mistakes (unknown template for the offline provider, missing API key, unknown thread) end with
exit code 1 and one line on stderr.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax

from a3r.app.session import Session, SessionSettings, Step, open_session, recorded_settings
from a3r.errors import A3RError
from a3r.providers import OfflineProvider, ProviderKind
from a3r.study.plans import TrainingSettings
from a3r.study.price import Serving, stage_s
from a3r.study.research import MAX_EVAL_TASKS, sweep_specs, token_cap
from a3r.study.settings import written
from a3r.study.teacher import distill_serve_line, is_url, read_teacher
from a3r.study.wording import counted
from a3r.swarmops.execution import PLAN_SERVE_OPTIONS
from a3r.swarmops.teacher import check_teacher_answers, teacher_token
from a3r.swarmops.tenancy import StageServing, TenantSettings, plan_stage_serving, stage_pricing
from memory import Store, StoreError
from swarm.client import ModelLoadError, check_model_path

if TYPE_CHECKING:
    from a3r.study.design import PriorFinding, StageSketch, StudyDesign
    from a3r.study.plans import PlanDraft

__all__ = ["ReaderSafeConsole", "register"]


class ReaderSafeConsole(Console):
    """A console that goes quiet instead of exiting once its reader has gone.

    ``a3r vibe … | head`` closes the pipe early. Rich's default answer to the `BrokenPipeError` is
    ``SystemExit(1)``, which would stop the thread in the middle of a run; here the output is pointed
    at ``/dev/null`` (the Python docs' recipe for SIGPIPE) and the thread runs to its end, recording
    everything in the store.
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.file.fileno())
        finally:
            os.close(devnull)


_out = ReaderSafeConsole(highlight=False, soft_wrap=True)


def _interrupt_on_sigterm() -> None:
    """Let SIGTERM stop a thread like Ctrl-C does (servers stopped, thread resumable)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _fail(message: str) -> typer.Exit:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"error: {message}", markup=False)
    return typer.Exit(code=1)


def _say(line: str) -> None:
    _out.print(f"· {line}", markup=False)


def _show_review(step: Step) -> None:
    review = step.review
    assert review is not None
    _out.print(
        Panel(
            Syntax(review.diff, "diff", word_wrap=True),
            title=f"patch {review.patch_id} of {review.file} (proposed by {review.proposed_by})",
            subtitle=review.diagnosis[:100],
        )
    )
    _out.print(f"rationale: {review.rationale}", markup=False)


def _drive(session: Session, step: Step, *, wait: bool) -> Step:
    """Loop over pending patches: prompt on a terminal, poll the store with ``--wait``, else stop."""
    while step.status == "waiting" and step.review is not None:
        review = step.review
        _show_review(step)
        if sys.stdin.isatty():
            approved = typer.confirm(f"approve patch {review.patch_id}?", default=False)
            note = (
                None
                if approved
                else (typer.prompt("reason (optional)", default="", show_default=False) or None)
            )
            step = session.resume({"action": "approve" if approved else "reject", "by": "cli", "note": note})
        elif wait:
            _out.print(f"waiting for a decision on patch {review.patch_id} (a3r tui, or another resume)…")
            step = session.wait_for_store_decision(review)
        else:
            _out.print(
                f"thread {session.thread_id} waits for a decision on patch {review.patch_id}: run "
                f"`a3r resume {session.thread_id} --approve` or `--reject` (or decide it in `a3r tui`)",
                markup=False,
            )
            return step
    return step


def _finish(step: Step) -> None:
    if step.status == "done":
        _out.print(f"thread {step.thread_id} done — study {step.study_id}", markup=False)
        if step.verdict:  # the one plain line first, the derivation below it
            _out.print(f"verdict: {step.verdict}", markup=False)
        if step.conclusion:
            _out.print(f"conclusion: {step.conclusion}", markup=False)
        if step.report:
            _out.print(f"report: {step.report}", markup=False)
        if step.stopped:  # scripts and CI must not read a failed thread as a success
            raise _fail("the thread stopped before reaching its goal (see the conclusion above)")


def _run_with_tui(session: Session, request: str, mode: Literal["vibe", "research"], **kwargs: Any) -> Step:
    """Run the thread in a background thread and the TUI in the foreground (decisions resume it)."""
    from a3r.app.tui import run_tui

    result: dict[str, Step] = {}

    def work() -> None:
        result["step"] = session.start(request, mode=mode, **kwargs)

    def on_decision(patch_id: int, approved: bool, note: str | None) -> None:
        worker.join()
        step = session.resume({"patch_id": patch_id, "approved": approved, "note": note, "by": "tui"})
        result["step"] = step

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    run_tui(session.store, on_decision=on_decision, approvals=True)
    worker.join()
    return result.get("step") or session.step()


def _check_server(url: str) -> None:
    """Fail with one line, before any thread or study exists, when ``url`` is not a reachable swarm server."""
    import httpx

    if not url.startswith(("http://", "https://")):
        raise _fail(f"--server {url}: expected an http(s):// URL, e.g. http://127.0.0.1:8000")
    try:
        response = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=10.0)
    except httpx.HTTPError as exc:
        raise _fail(f"--server {url}: cannot reach it ({type(exc).__name__}: {exc})") from None
    if response.status_code != 200:
        raise _fail(f"--server {url}: GET /v1/models answered {response.status_code}; is it a swarm server?")


def _check_teacher(request: str, settings: SessionSettings) -> None:
    """Fail with one line, before any thread or study exists, when the request's teacher is a URL that
    does not answer (`a3r.swarmops.teacher.check_teacher_answers`); a dry run never calls it (offline)."""
    try:
        teacher, _ = read_teacher(request)
        if teacher is not None and is_url(teacher):
            check_teacher_answers(teacher, teacher_token(settings.server_options))
    except A3RError as exc:
        raise _fail(str(exc)) from None


def _launch(
    request: str,
    mode: Literal["vibe", "research"],
    settings: SessionSettings,
    *,
    overrides: dict[str, Any],
    force: bool = False,
    tui: bool = False,
    wait: bool = False,
) -> None:
    if settings.model is not None:
        try:
            check_model_path(settings.model)
        except ModelLoadError as exc:
            raise _fail(f"--model {settings.model}: {exc}") from None
    if not request.strip():
        raise _fail(
            f'the request is empty: say what to {"train" if mode == "vibe" else "study"}, e.g. "train who-is-the-spy"'
        )
    if settings.provider is ProviderKind.offline:
        from a3r.study.design import check_overrides

        # The offline planner is deterministic and cheap: a request it cannot plan fails here, before
        # a thread, a store or a checkpoint exists (an LLM provider plans inside the thread).
        try:
            check_overrides(OfflineProvider().plan(request, mode=mode), overrides)
        except A3RError as exc:
            raise _fail(str(exc)) from None
    _check_teacher(request, settings)
    _interrupt_on_sigterm()
    thread = "THREAD"  # named once the session has one
    try:
        with open_session(settings, notify=_say) as session:
            thread = session.thread_id
            _out.print(
                f"thread {session.thread_id} (resume with `a3r resume {session.thread_id}`)", markup=False
            )
            if tui and importlib.util.find_spec("a3r.app.tui") is not None:
                step = _run_with_tui(session, request, mode, force=force, overrides=overrides)
            else:
                if tui:
                    _out.print("note: the TUI is not installed here; continuing without it")
                step = session.start(
                    request, mode=mode, force=force, overrides=overrides, started_at=command_started()
                )
            _finish(_drive(session, step, wait=wait))
    except (A3RError, StoreError) as exc:
        raise _fail(str(exc)) from None
    except KeyboardInterrupt:
        raise _fail(f"interrupted; continue with `a3r resume {thread}`") from None


def command_started() -> float:
    """When this ``a3r`` command started, on the `time.monotonic` clock: the process's start when the
    process is the command (the ``a3r`` console script, or ``python -m a3r.app.cli``; Linux: its start
    time in ``/proc/self/stat`` against ``/proc/uptime``), else now (the command invoked inside a
    longer-lived process, e.g. a test's ``CliRunner``, or off Linux). A thread's budget counts from the
    command's start: importing a3r takes 7–10 s on the loaded 2-core box, which a budget counted from
    the first node would leave out."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if argv0.name != "a3r" and argv0.parts[-3:] != ("a3r", "app", "cli.py"):
        return time.monotonic()
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        age_s = max(0.0, uptime_s - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        age_s = 0.0
    return time.monotonic() - age_s


StoreOption = Annotated[
    str, typer.Option("--store", "-s", help="Knowledge store: SQLite path or SQLAlchemy URL.")
]
RootOption = Annotated[Path, typer.Option("--root", help="Folder of checkpoints and study workspaces.")]
ProviderOption = Annotated[
    ProviderKind, typer.Option("--provider", help="Who plans: offline (no network), anthropic, openai.")
]
ProviderModelOption = Annotated[
    str | None, typer.Option("--provider-model", help="LLM name for the provider.")
]
BaseUrlOption = Annotated[
    str | None,
    typer.Option("--base-url", help="OpenAI-compatible endpoint (local vLLM/Ollama) or Anthropic proxy."),
]
ModelOption = Annotated[
    str | None, typer.Option("--model", help="Policy model for swarm serve (default: embedded).")
]
StepsOption = Annotated[int | None, typer.Option("--steps", min=1, help="Trainer steps per run.")]


def _finite_from(minimum: float) -> Any:
    """An option's check: refuse ``inf`` and ``nan`` as not finite numbers, then a value below
    ``minimum``; ``None`` (not given) passes. The range is checked here, not by ``min=``: typer's range
    check runs first and would call nan "not greater than or equal to" the minimum."""

    def check(value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise typer.BadParameter(f"{value} is not a finite number")
        if value is not None and value < minimum:
            raise typer.BadParameter(f"Input should be greater than or equal to {minimum:g}")
        return value

    return check


BudgetOption = Annotated[
    float,
    typer.Option(
        "--budget-minutes",
        callback=_finite_from(0.1),
        help="Wall-time budget of the whole thread in minutes (finite, >= 0.1): runs and evaluations are fitted into it.",
    ),
]
AutoOption = Annotated[bool, typer.Option("--auto-approve", help="Approve proposed patches without asking.")]
WaitOption = Annotated[
    bool, typer.Option("--wait", help="Off a terminal, wait for decisions taken in a3r tui.")
]
HangOption = Annotated[
    float,
    typer.Option(
        "--hang-after",
        callback=_finite_from(1),
        help="Seconds without progress before a run is hung (finite, >= 1).",
    ),
]
ServeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--serve-option",
        help="Extra `swarm serve` option for every started server, repeatable: "
        "--serve-option max-staleness=1 --serve-option threads=1 (true/false for flags).",
    ),
]


@dataclass(frozen=True)
class SessionFlags:
    """The options ``a3r vibe`` and ``a3r research`` share (store, root, provider, provider model, base
    URL, ``--hang-after``, ``--serve-option``), declared once by `with_session_flags`.

    Attributes are the options' values as typer parsed them; all but ``serve_option`` are the
    `SessionSettings` fields of the same name (``hang_after_s``: ``--hang-after``, in seconds).
    """

    store: str = ".a3r/memory.db"
    root: Path = Path(".a3r")
    provider: ProviderKind = ProviderKind.offline
    provider_model: str | None = None
    base_url: str | None = None
    hang_after_s: float = 180.0
    serve_option: list[str] | None = None

    def settings(
        self, training_options: tuple[str, ...], *, unfit: list[str] | None = None, **fields: Any
    ) -> tuple[SessionSettings, dict[str, Any]]:
        """The thread's settings from these options and the command's own ``fields``, and the plan's
        trainer overrides the ``--serve-option`` items carry.

        Args:
            training_options: The command's options that set the plan's training settings (named in
                the error for a ``--serve-option`` that sets one of them).
            unfit: For a dry run: what this machine lacks to run the servers (no CUDA device, vLLM not
                installed: `swarm.serve_options.MachineUnfit`) is appended here instead of refused.
            **fields: Further `SessionSettings` fields (``model``, ``budget_minutes``, ...).

        Raises:
            typer.Exit: A ``--serve-option`` that a3r sets itself or that ``swarm serve`` refuses (one line).
        """
        server_options = _serve_options(self.serve_option, options=training_options, unfit=unfit)
        same_named = {name: value for name, value in vars(self).items() if name != "serve_option"}
        settings = SessionSettings(**same_named, server_options=server_options, **fields)
        return settings, _trainer_overrides(server_options)


_SESSION_PARAMETERS = [
    inspect.Parameter(
        field.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=option, default=field.default
    )
    for field, option in zip(
        dataclasses.fields(SessionFlags),
        (
            StoreOption,
            RootOption,
            ProviderOption,
            ProviderModelOption,
            BaseUrlOption,
            HangOption,
            ServeOption,
        ),
        strict=True,
    )
]
"""The `SessionFlags` fields as typer parameters: each field's option declaration and default."""


def with_session_flags(command: Callable[..., None]) -> Callable[..., None]:
    """Declare the `SessionFlags` options on a typer command: its parameter ``flags: SessionFlags =
    SessionFlags()`` becomes these options, in that place of its signature (so of its ``--help``), and the command is
    called with them gathered in one `SessionFlags`."""
    signature = inspect.signature(command, eval_str=True)
    parameters = [
        new
        for old in signature.parameters.values()
        for new in (_SESSION_PARAMETERS if old.name == "flags" else [old])
    ]

    @functools.wraps(command)
    def wrapper(**options: Any) -> None:
        flags = SessionFlags(**{p.name: options.pop(p.name) for p in _SESSION_PARAMETERS})
        command(**options, flags=flags)

    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
    return wrapper


_MANAGED_SERVE_OPTIONS = {
    "model": "use --model",
    "port": "a3r picks a free port for every server",
    "host": "a3r's servers listen on loopback",
    "run-dir": "a3r keeps each server's run dir in the study workspace",
    "admin-token": "a3r gives its servers a fresh admin token (never recorded in the store)",
    **dict.fromkeys(("training-config", *PLAN_SERVE_OPTIONS), ""),  # `_plan_hint`: what the command has
    **dict.fromkeys(
        ("teacher", "teacher-url"),
        "name the teacher in the request: 'distil http://host:port into the embedded model on arithmetic' "
        "(or a checkpoint directory, which a3r serves itself)",
    ),
}
"""``swarm serve`` options a3r sets itself, with why they cannot be passed ("": set from the plan)."""

VIBE_TRAINING_OPTIONS = ("--steps", "--batch-size", "--group-size")
"""The options of ``a3r vibe`` that set the plan's training settings."""

RESEARCH_TRAINING_OPTIONS = ("--steps", "--group-size", "--seeds")
"""The options of ``a3r research`` that set the plan's training settings (B has none: a question
varies it, or the question gives it as ``batch_size=N``)."""


def _plan_hint(key: str, options: tuple[str, ...]) -> str:
    """Why the ``swarm serve`` option ``key`` is set from the plan, and what sets it with the command
    whose training options are ``options``: its own option where it has one, else the request's
    ``name=value`` pair or a research question about it."""
    field = {"max-steps": "steps"}.get(key, key.replace("-", "_"))
    own = f"--{field.replace('_', '-')}"
    if key == "training-config":
        return f"a3r sets training from its plan; use {', '.join(options)}"
    if own in options:
        return f"set from the plan for every run; use {own}"
    if field in TrainingSettings.model_fields:
        return (
            f"set from the plan for every run; write {field}=<value> in the request, or ask a research "
            "question about it"
        )
    return "set from the plan for every run (the plan decides it)"


def _serve_options(
    items: list[str] | None, *, options: tuple[str, ...], unfit: list[str] | None = None
) -> dict[str, Any]:
    """``KEY=VALUE`` items → ``swarm serve`` options (``true``/``false`` become flags).

    Args:
        items: The ``--serve-option`` values.
        options: The command's training options (`VIBE_TRAINING_OPTIONS`, `RESEARCH_TRAINING_OPTIONS`),
            named by the refusal of an option a3r sets from the plan.
        unfit: See `SessionFlags.settings`.

    Raises:
        typer.Exit: an item is not ``KEY=VALUE``, or a3r sets it (one line, exit code 1).
    """
    result: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip().removeprefix("--").replace("_", "-")
        if not sep or not key:
            raise _fail(f"--serve-option {item!r}: expected KEY=VALUE, e.g. max-staleness=1")
        if key in _MANAGED_SERVE_OPTIONS and key not in TRAINER_SERVE_OPTIONS:
            raise _fail(f"--serve-option {key}: {_MANAGED_SERVE_OPTIONS[key] or _plan_hint(key, options)}")
        lowered = value.strip().lower()
        if key == "quota":  # repeatable, like swarm serve --quota
            result.setdefault(key, []).append(value.strip())
            continue
        result[key] = {"true": True, "false": False}.get(lowered, value.strip())
    _check_serve_options(result, unfit)
    return result


TRAINER_SERVE_OPTIONS = {
    "kl-coef": "kl_coef",
    "clip-eps": "clip_eps",
    "ppo-epochs": "ppo_epochs",
    "minibatches": "minibatches",
}
"""``swarm serve`` options a user may still pass with ``--serve-option``: they become the plan's
training settings (`TrainingSettings`), which every run sends to its server."""


def _trainer_overrides(options: dict[str, Any]) -> dict[str, Any]:
    """Move `TRAINER_SERVE_OPTIONS` out of ``options`` into training-setting overrides."""
    return {
        TRAINER_SERVE_OPTIONS[key]: options.pop(key) for key in list(options) if key in TRAINER_SERVE_OPTIONS
    }


def _check_serve_options(options: dict[str, Any], unfit: list[str] | None = None) -> None:
    """Validate ``options`` as ``swarm serve`` would (names, types, ranges, device, model), in process,
    before any thread. ``unfit`` (a dry run): what this machine lacks is appended there instead
    (`swarm.serve_options.ServeOptions.check`).

    Raises:
        typer.Exit: ``swarm serve`` would refuse them (one line naming the option, exit code 1).
    """
    from swarm.client import ServeOptions, ServeOptionsError

    if not options:
        return
    try:
        ServeOptions.from_flags(options).check(unfit=unfit)
    except ServeOptionsError as exc:
        raise _fail(f"--serve-option: swarm serve refuses it: {exc}") from None


@with_session_flags
def vibe(
    request: Annotated[str, typer.Argument(help='What to train, e.g. "train who-is-the-spy".')],
    model: ModelOption = None,
    steps: StepsOption = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", min=1, help="B: groups per step.")] = None,
    group_size: Annotated[
        int | None, typer.Option("--group-size", min=2, help="G: episodes per task.")
    ] = None,
    budget_minutes: BudgetOption = 30.0,
    auto_approve: AutoOption = False,
    server: Annotated[
        str | None, typer.Option("--server", help="Attach to this swarm server instead of starting one.")
    ] = None,
    tui: Annotated[bool, typer.Option("--tui", help="Oversee the run in the TUI (approvals there).")] = False,
    wait: WaitOption = False,
    flags: SessionFlags = SessionFlags(),
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the plan and stop: nothing is started, written or stored."),
    ] = False,
) -> None:
    """Plan, code, smoke-test, train, monitor, patch (with approval) and report on one request."""
    unfit: list[str] | None = [] if dry_run else None
    settings, trainer = flags.settings(
        VIBE_TRAINING_OPTIONS,
        unfit=unfit,
        model=model,
        server_url=server,
        auto_approve=auto_approve,
        budget_minutes=budget_minutes,
    )
    if server is not None:
        _check_server(server)
    overrides = trainer | {
        k: v
        for k, v in {"steps": steps, "batch_size": batch_size, "group_size": group_size}.items()
        if v is not None
    }
    if dry_run:
        _print_plan(request, settings, overrides)
        _say_unfit(unfit)
        return
    _launch(request, "vibe", settings, overrides=overrides, tui=tui, wait=wait)


def _dry_plan(
    request: str, settings: SessionSettings, overrides: dict[str, Any], *, mode: Literal["vibe", "research"]
) -> tuple[PlanDraft, str]:
    """The provider's plan with the command line's training overrides, checked, for a dry run; and
    the provider's name.

    Raises:
        typer.Exit: the provider or the plan refuses (one line, exit code 1).
    """
    from a3r.providers import ProviderConfig, make_provider
    from a3r.study.design import check_overrides, restate_for_training
    from a3r.study.plans import check_plan

    try:
        config = ProviderConfig.from_env(
            settings.provider, model=settings.provider_model, base_url=settings.base_url
        )
        draft = make_provider(config).plan(request, mode=mode)
        check_overrides(draft, overrides)
        training = TrainingSettings.model_validate({**draft.training.model_dump(), **overrides})
        plan = draft.model_copy(update={"training": training})
        plan = restate_for_training(draft, plan)  # the hypotheses say the seeds asked for
        return check_plan(plan), config.kind.value
    except A3RError as exc:
        raise _fail(str(exc)) from None
    except (
        ValidationError
    ) as exc:  # a command-line value out of the settings' range: its first error, one line
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise _fail(f"the plan's training settings: {where}: {first['msg']}") from None
    except ValueError as exc:
        raise _fail(f"the plan's training settings: {exc}") from None


def _param_lines(draft: PlanDraft, *, skip: str | None = None) -> list[str]:
    """The plan's template parameters (but ``skip``), one ``name = value (where from)`` each: the
    template's default, or set by the plan (the request or the provider's choice; `PlanDraft.rationale`
    says which)."""
    import templates

    specs = (
        {p.name: p for p in templates.get_template(draft.template).meta.parameters} if draft.template else {}
    )
    lines = []
    for name, value in sorted(draft.params.items()):
        spec = specs.get(name)
        if name == skip:
            continue
        if spec is None:
            lines.append(f"{name} = {written(value)}")
        elif value == spec.default:
            lines.append(f"{name} = {written(value)}  (template default)")
        else:
            lines.append(
                f"{name} = {written(value)}  (set by the plan; template default {written(spec.default)})"
            )
    return lines


def _dry_speed(settings: SessionSettings, plan: PlanDraft) -> tuple[float, str]:
    """Seconds per episode a dry run prices episodes at, and where the number comes from: the median
    of the finished runs on the plan's template with the session's model in the knowledge store
    (`a3r.graph.records.stored_speed`), else the template's model calls and tokens per episode
    (`a3r.study.design.assumed_speed`)."""
    from a3r.graph.records import stored_speed
    from a3r.study.design import assumed_speed

    template = plan.template
    if "://" not in settings.store and Path(settings.store).is_file():
        with closing(Store(settings.store)) as store:
            found = stored_speed(store, template, settings.model)
        if found is not None:
            return found[
                0
            ], f"measured: the median of {found[1]} earlier {template} run(s) in {settings.store}"
    speed, assumes = assumed_speed(template, plan.params)
    options = settings.server_options
    engine, device = str(options.get("engine", "hf")), str(options.get("device", "cpu"))
    if (engine, device) != ("hf", "cpu"):  # the assumed speed is the hf engine's on CPU (fresh-s5 #14)
        assumes += (
            f" (the hf engine's speed on CPU, likely an overestimate for this plan's engine={engine}, "
            f"device={device}, which this dry run does not price)"
        )
    return speed, f"{assumes}; no earlier run of this template and model in the store"


def _print_plan(request: str, settings: SessionSettings, overrides: dict[str, Any]) -> None:
    """``a3r vibe --dry-run``: the planner's plan (template, parameters, trainable agents, training)."""
    import templates
    from a3r.study.plans import steps_warning, temperature_warning

    if not request.strip():
        raise _fail('the request is empty: say what to train, e.g. "train who-is-the-spy"')
    draft, provider = _dry_plan(request, settings, overrides, mode="vibe")
    training = draft.training
    template = templates.get_template(draft.template) if draft.template else None
    agents = template.trainable_agents(draft.params) if template else None
    _out.print(f"plan (dry run, provider {provider}): {draft.objective}", markup=False)
    _out.print(f"  template: {draft.template or '(new code)'}", markup=False)
    for line in _param_lines(draft):
        _out.print(f"    {line}", markup=False)
    if template and template.meta.defaults_evidence:
        _out.print(f"    (defaults: {template.meta.defaults_evidence})", markup=False)
    if agents is not None:
        _out.print(f"  trainable agents: {', '.join(agents) or '(none)'}", markup=False)
    fields = ", ".join(f"{k}={v}" for k, v in training.shown_fields().items())
    _out.print(f"  training: {fields}", markup=False)
    if training.distill and training.teacher is not None:
        _out.print(f"  distillation: {distill_serve_line(training)}", markup=False)
    for warning in (steps_warning(draft), temperature_warning(draft)):
        if warning is not None:
            _out.print(f"  {warning}", markup=False)
    for hypothesis in draft.hypotheses:
        _out.print(f"  hypothesis: {hypothesis.statement}", markup=False)
        _out.print(f"    decision rule: {hypothesis.decision_rule}", markup=False)
    _out.print(f"  why: {draft.rationale}", markup=False)
    from a3r.study.price import SERVER_OVERHEAD_S, vibe_thread_s

    speed, source = _dry_speed(settings, draft)
    total = vibe_thread_s(
        training, seconds_per_episode=speed, eval_episodes=settings.eval_tasks * settings.eval_samples
    )
    smoke = training.smoke_tasks * training.group_size * speed
    _out.print(
        f"  stages: smoke ({training.smoke_tasks} task(s)) and held-out baseline → {training.steps} steps on seed(s) "
        f"{training.seeds} (fitted to the budget after the smoke run: a smaller B first, fewer steps only if B = 1 "
        "does not fit; re-planned after every step, back up to these steps and B when time allows) → held-out "
        "evaluation → report",
        markup=False,
    )
    _out.print(
        f"  estimated time: ≈ {total / 60:.0f} min at {speed:.2f} s per episode ({source}; the smoke run "
        f"measures it); budget {settings.budget_minutes:g} min",
        markup=False,
    )
    budget_s = settings.budget_minutes * 60
    if total > budget_s:
        floor_s = smoke + SERVER_OVERHEAD_S  # the held-out evaluations are sized to the budget; this is not
        minutes = math.ceil(floor_s / 6) / 10  # up to the next 0.1 min
        cut = (
            f"the smoke run alone needs ≈ {minutes:g} min, so the budget would stop the thread before it "
            f"trains; give --budget-minutes well over {minutes:g}"
            if floor_s > budget_s
            else "after the smoke run the training (and its held-out evaluation) is fitted to the budget: a "
            "smaller B first, fewer steps only if B = 1 does not fit"
        )
        _out.print(
            f"  warning: the estimate exceeds the budget of {settings.budget_minutes:g} min at this speed: {cut}",
            markup=False,
        )


@with_session_flags
def research(
    question: Annotated[
        str, typer.Argument(help='A research question, e.g. "find min stable batch size on AIME".')
    ],
    model: ModelOption = None,
    steps: StepsOption = None,
    seeds: Annotated[
        int | None, typer.Option("--seeds", min=2, help="Seeds per configuration (>= 2).")
    ] = None,
    group_size: Annotated[
        int | None, typer.Option("--group-size", min=2, help="G: episodes per task.")
    ] = None,
    budget_minutes: BudgetOption = 60.0,
    force: Annotated[
        bool, typer.Option("--force", help="Sweep even when the preflight finds too little signal for GRPO.")
    ] = False,
    eval_tasks: Annotated[
        int,
        typer.Option(
            "--eval-tasks",
            min=1,
            max=MAX_EVAL_TASKS,
            help="Held-out tasks per evaluation (at most the template's held-out split: a quarter of a "
            "fixed dataset's tasks).",
        ),
    ] = 16,
    flags: SessionFlags = SessionFlags(),
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the staged plan (stages, configurations, seeds, hypotheses, prior findings, "
            "estimated time) and stop: nothing is started, written or stored.",
        ),
    ] = False,
    tenants: Annotated[
        bool | None,
        typer.Option(
            "--tenants/--no-tenants",
            help="Train a sweep stage's LoRA runs side by side as tenants of one swarm server (where the "
            "stage qualifies); --no-tenants: one server per run. Default: tenants with --serve-option "
            "engine=vllm, one server per run on the hf (CPU) engine. vLLM serves tenants in bf16/fp16 only: "
            "every server of a study uses --serve-option dtype (default auto: bf16 on the GPU), and "
            "dtype=float32 on vLLM keeps one server per run.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Answer a research question with a pre-registered, staged, multi-seed sweep."""
    unfit: list[str] | None = [] if dry_run else None
    settings, trainer = flags.settings(
        RESEARCH_TRAINING_OPTIONS,
        unfit=unfit,
        model=model,
        budget_minutes=budget_minutes,
        eval_tasks=eval_tasks,
        tenants=tenants,
    )
    overrides: dict[str, Any] = dict(trainer)
    if steps is not None:
        overrides["steps"] = steps
    if seeds is not None:
        overrides["seeds"] = list(range(seeds))
    if group_size is not None:
        overrides["group_size"] = group_size
    if dry_run:
        _print_research_plan(question, settings, overrides)
        _say_unfit(unfit)
        return
    if settings.provider is ProviderKind.offline:  # deterministic and cheap: checked before a thread exists
        misfit = _misfit(_research_design(question, settings, overrides))
        if misfit is not None:
            raise _fail(misfit)
    _launch(question, "research", settings, overrides=overrides, force=force)


def _say_unfit(unfit: list[str] | None) -> None:
    """The dry run's last line when this machine cannot run the plan it printed (a real run refuses)."""
    if unfit:
        _out.print(
            f"  note: this machine cannot run it (the dry run starts nothing): {'; '.join(unfit)}",
            markup=False,
        )


def _minutes(seconds: float) -> str:
    """Minutes for an estimate: one decimal below 10 (so a short plan does not read ``≈ 0 min``)."""
    minutes = seconds / 60
    return f"{minutes:.1f}" if minutes < 10 else f"{minutes:.0f}"


@dataclass(frozen=True)
class _ResearchDesign:
    """What a research dry run prints and a real run checks before it starts: the plan, its staged
    design and where its numbers come from."""

    plan: PlanDraft
    provider: str
    design: StudyDesign
    settings: SessionSettings
    priors: list[PriorFinding]
    store_note: str
    speed: float
    source: str
    fewer: str


def _research_design(question: str, settings: SessionSettings, overrides: dict[str, Any]) -> _ResearchDesign:
    """The staged design (`a3r.study.design.design_study`) of the question's plan, with prior findings
    read from the store when it exists (never created or written)."""
    from a3r.graph.coder import heldout_capacity
    from a3r.graph.context import RunContext
    from a3r.graph.records import prior_findings
    from a3r.study.design import design_study

    if not question.strip():
        raise _fail('the question is empty: ask one, e.g. "find the best KL coefficient on arithmetic"')
    plan, provider = _dry_plan(question, settings, overrides, mode="research")
    assert plan.sweep is not None
    capacity = heldout_capacity(plan)
    fewer = ""
    if capacity is not None and capacity < settings.eval_tasks:
        fewer = (
            f"  note: --eval-tasks {settings.eval_tasks}, but the {plan.template} template's held-out split has "
            f"{capacity} tasks (a quarter of its tasks): every evaluation runs those {capacity}"
        )
        settings = settings.model_copy(update={"eval_tasks": capacity})
    priors = []
    store_note = f"no knowledge store at {settings.store}: no prior findings"
    if "://" not in settings.store and Path(settings.store).is_file():
        with closing(Store(settings.store)) as store:
            priors = prior_findings(store, plan, model=settings.model)
        store_note = (
            f"knowledge store {settings.store}: {len(priors)} prior finding(s) of the same configurations"
        )
    measured = [o.seconds_per_episode for p in priors for o in p.outcomes if o.seconds_per_episode > 0]
    speed, source = (
        (sorted(measured)[len(measured) // 2], "the median of the prior runs")
        if measured
        else _dry_speed(settings, plan)
    )
    design = design_study(
        plan,
        priors=priors,
        seconds_per_episode=speed,
        speed_source=source,
        eval_episodes=settings.eval_tasks * settings.eval_samples,
        preflight_episodes=settings.eval_tasks * RunContext.preflight_samples,
    )
    return _ResearchDesign(plan, provider, design, settings, priors, store_note, speed, source, fewer)


def _misfit(found: _ResearchDesign, *, source: bool = True) -> str | None:
    """When the least the study can run to answer its goal (`StudyDesign.smallest_need_s`: the preflight
    and its cheapest coarse configurations that can answer on every seed, two for a best-value question
    and one for a min-stable one, `a3r.study.design.answering_values`; for an A-vs-B or effect-of study both arms,
    which the runner never splits) does not fit the budget at the design's speed: one line saying what it
    needs and the ``--budget-minutes`` to give; else ``None``."""
    plan, design, settings = found.plan, found.design, found.settings
    assert plan.sweep is not None
    need = _smallest_need_s(found)
    if design.cheapest is None or need <= settings.budget_minutes * 60:
        return None
    minutes = math.ceil(need / 6) / 10  # up to the next 0.1 min
    speed = f"{design.seconds_per_episode:.2f} s per episode" + (f" ({found.source})" if source else "")
    seeds = counted(len(plan.training.seeds), "seeds")
    if plan.sweep.goal in ("a_vs_b", "effect_of"):
        what = f"the comparison does not fit the budget of {settings.budget_minutes:g} min: both {plan.sweep.variable} values on {seeds}"
    else:
        values = design.cheapest[0]
        named = ", ".join(design.setting.text(v) for v in values)
        what = (
            f"not one stage of the study fits the budget of {settings.budget_minutes:g} min: its cheapest "
            + (
                f"configurations that can answer ({plan.sweep.variable} = {named}) on {seeds} each"
                if len(values) > 1
                else f"configuration ({plan.sweep.variable} = {named}) on {seeds}"
            )
        )
    return f"{what} and the preflight need ≈ {minutes:g} min at {speed}; give --budget-minutes {minutes:g} or more"


def _pricing(found: _ResearchDesign) -> Serving:
    """How the runner will serve a stage's runs, for their price (`a3r.swarmops.tenancy.stage_pricing`)."""
    settings = found.settings
    tenants = TenantSettings(enabled=settings.tenants, max_tenants=settings.max_tenants)
    return stage_pricing(tenants, settings.server_options)


def _smallest_need_s(found: _ResearchDesign) -> float:
    """`StudyDesign.smallest_need_s`, its coarse configurations priced as the runner serves them: as one
    tenant stage where tenants are on (`a3r.study.price.stage_s`)."""
    plan, design, serving = found.plan, found.design, _pricing(found)
    if design.cheapest is None or not serving.tenants or plan.sweep is None:
        return design.smallest_need_s
    coarse = next(s for s in design.stages if s.name == "coarse")
    both = plan.sweep.goal in ("a_vs_b", "effect_of")  # the runner never runs one arm alone
    values = coarse.values if both else list(design.cheapest[0])
    price = stage_s(
        sweep_specs(plan, values, "coarse"),
        seconds_per_episode=design.seconds_per_episode,
        eval_episodes=found.settings.eval_tasks * found.settings.eval_samples,
        measured_tokens=token_cap(plan),
        serving=serving,
    )
    return design.smallest_need_s - design.cheapest[1] + price


def _print_research_plan(question: str, settings: SessionSettings, overrides: dict[str, Any]) -> None:
    """``a3r research --dry-run``: the staged design of the plan (`_research_design`) and whether it
    fits the budget; a study of which not one stage fits is refused (`_misfit`: one line, exit code 1)."""
    found = _research_design(question, settings, overrides)
    misfit = _misfit(found)
    if misfit is not None:
        raise _fail(misfit)
    say = functools.partial(_out.print, markup=False)
    for line in (*_plan_lines(found), *_stage_lines(found), *_finding_lines(found)):
        say(line)
    warning = _budget_warning(found)
    if warning is not None:
        say(f"  warning: {warning}")


def _plan_lines(found: _ResearchDesign) -> list[str]:
    """The dry run's head: the plan, its template, varied setting, parameters and fixed settings."""
    plan, setting = found.plan, found.design.setting
    assert plan.sweep is not None
    sweep = plan.sweep
    lines = [
        f"plan (dry run, provider {found.provider}): {plan.objective}",
        f"  template: {plan.template or '(new code)'}; varied: {setting.label} ({sweep.variable}, {setting.target} setting)",
    ]
    if found.fewer:
        lines.append(found.fewer)
    if plan.params:  # the template's knobs the runs use (the varied one excepted)
        lines += [
            "  template parameters:",
            *(f"    {line}" for line in _param_lines(plan, skip=sweep.variable)),
        ]
    fixed = ", ".join(
        f"{k}={v}"
        for k, v in plan.training.shown_fields().items()
        if k not in (sweep.variable, "seeds", "concurrency", "smoke_tasks")
    )
    lines.append(f"  goal: {sweep.goal.replace('_', '-')}; fixed: {fixed}")
    if plan.training.teacher is not None:
        arm = "its distillation arm" if sweep.variable == "distill" else "every run"
        lines.append(f"  distillation ({arm}): {distill_serve_line(plan.training)}")
    return lines


def _stage_lines(found: _ResearchDesign) -> list[str]:
    """One line per stage: its configurations, seeds, runs and estimated minutes."""
    design, variable = found.design, found.plan.sweep.variable if found.plan.sweep else ""
    lines = ["  stages:"]
    for stage in design.stages:
        parts = (
            [f"{variable} ∈ {{{', '.join(design.setting.text(v) for v in stage.values)}}}"]
            if stage.values
            else []
        )
        parts += [f"{stage.seeds} seeds per configuration"] if stage.seeds else []
        most = "up to " if stage.name in ("refine", "replicate") else ""
        reused = (
            f" to run ({design.reused_runs} reused from prior findings)"
            if stage.name == "coarse" and design.reused_runs
            else ""
        )
        serving = _serving(found, stage)
        seconds = stage.seconds if serving.seconds is None else serving.seconds
        parts.append(f"{most}{stage.runs} run(s){reused}, ≈ {seconds / 60:.1f} min")
        lines.append(f"    {stage.name}: {'; '.join(parts)} — {stage.note}")
        lines += [f"      servers: {line}" for line in serving.lines]
    return lines


def _serving(found: _ResearchDesign, stage: StageSketch) -> StageServing:
    """How a stage's runs will be served (`a3r.swarmops.tenancy.plan_stage_serving`); the preflight
    has one run on its own server."""
    if stage.name == "preflight":
        return StageServing([], 0)
    return plan_stage_serving(
        found.plan,
        stage.name,
        stage.values,
        seeds=stage.seeds,
        runs=stage.runs,
        server_options=found.settings.server_options,
        enabled=found.settings.tenants,
        max_tenants=found.settings.max_tenants,
        seconds_per_episode=found.design.seconds_per_episode,
        eval_episodes=found.settings.eval_tasks * found.settings.eval_samples,
    )


def _estimated_s(found: _ResearchDesign) -> float:
    """The design's estimate with each stage whose runs are tenants of one server priced as such
    (`a3r.study.price.stage_s`: one server start, not one per run, and per wave its slowest run on vLLM)."""
    total = 0.0
    for stage in found.design.stages:
        serving = _serving(found, stage)
        total += stage.seconds if serving.seconds is None else serving.seconds
    return total


def _finding_lines(found: _ResearchDesign) -> list[str]:
    """The hypotheses, the stability rule, the prior findings and the estimated time."""
    plan, design = found.plan, found.design
    lines: list[str] = []
    for hypothesis in plan.hypotheses:
        lines += [f"  hypothesis: {hypothesis.statement}", f"    decision rule: {hypothesis.decision_rule}"]
    if plan.stability is not None:
        from a3r.graph.context import RunContext

        tasks = found.settings.eval_tasks  # what the plan asks for; the budget may cut attempts
        n = {"tasks": tasks, "after": tasks * found.settings.eval_samples}
        n["before"] = tasks * RunContext.preflight_samples
        lines.append(f"  stability: {plan.stability.describe(**n, planned=True)}")
        short = plan.stability.window_warning(plan.training.steps)
        if short is not None:
            lines.append(f"  {short}")
    lines.append(f"  prior findings: {found.store_note}")
    lines += [f"    reused: {prior.cite()}" for prior in found.priors]
    reused = (
        f"; {design.reused_runs} run(s) of prior findings are reused, not run again (not in the estimate)"
        if design.reused_runs
        else ""
    )
    lines.append(
        f"  estimated time: ≈ {_minutes(_estimated_s(found))} min for up to {design.runs} run(s) still to run at "
        f"{found.speed:.2f} s per episode ({found.source}){reused}; budget {found.settings.budget_minutes:g} min"
    )
    return lines


def _budget_warning(found: _ResearchDesign) -> str | None:
    """What the runner would cut when the estimate exceeds the budget (`budget_drops`); ``None`` when
    it fits."""
    from a3r.study.design import budget_drops

    plan, design, settings = found.plan, found.design, found.settings
    assert plan.sweep is not None
    if _estimated_s(found) <= settings.budget_minutes * 60:
        return None
    dropped = budget_drops(
        plan,
        design,
        budget_s=settings.budget_minutes * 60,
        eval_episodes=settings.eval_tasks * settings.eval_samples,
        serving=_pricing(found),
    )
    # the stages after the coarse one this design has (an A-vs-B or effect-of study has no refine)
    later = [s.name for s in design.stages if s.name not in ("preflight", "coarse")]
    shown = ", ".join(design.setting.text(v) for v in dropped)
    cut = (
        f"the runner would drop {plan.sweep.variable} values {{{shown}}} from the coarse stage"
        + (
            ": no sweep run would start after the preflight"
            if len(dropped) == len(design.stages[1].values)
            else ""
        )
        if dropped
        else "the coarse stage fits"
        + (
            f"; the {' and '.join(later)} stage{'s stop' if len(later) > 1 else ' stops'} when the budget runs out"
            if later
            else ""
        )
    )
    return f"the estimate exceeds the budget of {settings.budget_minutes:g} min at this speed: {cut}"


def resume(
    thread: Annotated[str, typer.Argument(help="Thread id printed by vibe/research.")],
    approve: Annotated[bool, typer.Option("--approve", help="Approve the pending patch.")] = False,
    reject: Annotated[bool, typer.Option("--reject", help="Reject the pending patch.")] = False,
    note: Annotated[str | None, typer.Option("--note", help="Comment kept with the decision.")] = None,
    auto_approve: Annotated[
        bool | None, typer.Option("--auto-approve/--ask", help="Override the thread's approval mode.")
    ] = None,
    budget_minutes: Annotated[
        float | None,
        typer.Option(
            "--budget-minutes",
            callback=_finite_from(0.1),
            help="New budget of the thread in minutes (finite, >= 0.1).",
        ),
    ] = None,
    wait: WaitOption = False,
    root: RootOption = Path(".a3r"),
    store: Annotated[str | None, typer.Option("--store", "-s", help="Store (default: the thread's).")] = None,
) -> None:
    """Continue a thread after a crash, or decide its pending patch."""
    if approve and reject:
        raise _fail("--approve and --reject exclude each other")
    settings = recorded_settings(root, thread)
    if settings is None:
        raise _fail(f"unknown thread {thread!r} (no record under {root / 'checkpoints.db'})")
    changes: dict[str, Any] = {"root": root}
    if store is not None:
        changes["store"] = store
    if auto_approve is not None:
        changes["auto_approve"] = auto_approve
    if budget_minutes is not None:
        changes["budget_minutes"] = budget_minutes
    settings = settings.model_copy(update=changes)
    decision = None
    if approve or reject:
        decision = {"action": "approve" if approve else "reject", "by": "cli", "note": note}
    _interrupt_on_sigterm()
    try:
        with open_session(settings, thread_id=thread, notify=_say) as session:
            step = session.resume(decision, started_at=command_started())
            _finish(_drive(session, step, wait=wait))
    except (A3RError, StoreError) as exc:
        raise _fail(str(exc)) from None
    except KeyboardInterrupt:
        raise _fail(f"interrupted; continue with `a3r resume {thread}`") from None


def register(app: typer.Typer) -> None:
    """Add ``vibe``, ``research`` and ``resume`` to the ``a3r`` app."""
    app.command()(vibe)
    app.command()(research)
    app.command()(resume)
