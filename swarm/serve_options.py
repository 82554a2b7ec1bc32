"""``swarm serve``'s options: one flat model whose fields are the command's flags (names, defaults, help).

:class:`FlagOptions` is that kind of model in general (also ``swarm run``'s ``RunOptions``, in
``swarm/run_options.py``): fields declared with :func:`option` carry their ``--help`` text, how the command line
shows them (:class:`CliSpec`) and the configuration field they set, from which a validation error of the
configuration is traced back to the flag to fix. ``swarm``'s commands generate their Typer signatures
from these fields (``swarm/cli.py``).

:class:`ServeOptions` is the small command-line config that builds the full :class:`swarm.config.ServerConfig`
(as tinker-cookbook's recipes build ``train.Config`` from a ``CLIConfig``): ``swarm serve``'s Typer
signature is generated from its fields, and a3r validates its ``--serve-option`` items with it in process
and starts servers with :meth:`ServeOptions.argv`. Every mistake is one line naming the flag.

This module imports no torch (``swarm`` starts in a third of a second; :mod:`swarm.config` takes seconds):
building or checking the server configuration imports it when called.
"""

from __future__ import annotations

import contextlib
import itertools
import tempfile
from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, cast, get_origin

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic.fields import FieldInfo

from swarm.errors import ConfigError, SwarmError
from swarm.protocol import MIN_TOKEN_CHARS

if TYPE_CHECKING:
    from swarm.config import ServerConfig, TrainingConfig

__all__ = [
    "CliSpec",
    "FlagOptions",
    "LogLevel",
    "MachineUnfit",
    "ServeOptions",
    "ServeOptionsError",
    "check_device",
    "cli_spec",
    "option",
]


DEFAULT_REQUEST_TOKENS_SHARE = 0.5
"""``--max-request-tokens`` left out: a chat request may ask for at most this share of the model's context
window (`ServerConfig.request_tokens_share`); a caller that could ask for all of it would hold an hf
engine's batch for the whole context, and leave no room for its own prompt."""


class LogLevel(StrEnum):
    """``swarm serve --log-level``."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class ServeOptionsError(ConfigError):
    """``swarm serve`` options that cannot run a server; the message names the option (``--lr: …``)."""


class MachineUnfit(ServeOptionsError):
    """Valid options this machine cannot run: no CUDA device, vLLM or verl not installed. A dry run that
    starts nothing reports them (`ServeOptions.check`'s ``unfit``) instead of refusing."""


class CliSpec(TypedDict, total=False):
    """How the command line shows one option beyond its name, default and help (all optional)."""

    decls: list[str]
    """Typer's parameter declarations instead of the generated ``--name`` (e.g. ``["--fresh"]``: a flag
    without ``--no-fresh``)."""
    argument: bool
    """A positional argument, not an option."""
    secret: bool
    """A secret: its default is never shown, nor is it written by :meth:`ServeOptions.argv`."""
    min: int
    """Smallest value the command line accepts (a usage error below)."""
    envvar: str
    """Environment variable read when the option is not given (shown in ``--help``)."""


def option(
    default: Any, help: str, *, to: str | None = None, cli: CliSpec | None = None, **constraints: Any
) -> Any:
    """A field of a :class:`FlagOptions` model: its default (``...``: required), its ``--help`` text, the
    dotted path of the configuration field it sets (``to``), from which validation errors are traced back
    to it, and how the command line shows it (``cli``)."""
    extra: dict[str, Any] = {}
    if to:
        extra["to"] = to
    if cli:
        extra["cli"] = dict(cli)
    return Field(default, description=help, json_schema_extra=extra or None, **constraints)


def cli_spec(info: FieldInfo) -> CliSpec:
    """The :class:`CliSpec` of a field declared with :func:`option` (empty when it has none)."""
    extra = info.json_schema_extra
    spec = extra.get("cli") if isinstance(extra, dict) else None
    return cast(CliSpec, spec) if isinstance(spec, dict) else CliSpec()


class FlagOptions(BaseModel):
    """A command's options as one flat model, one field per flag (``max_staleness`` is
    ``--max-staleness``), each declared with :func:`option`; subclasses build their configuration and
    report its errors with :meth:`flags_at`."""

    model_config = ConfigDict(extra="forbid")

    error: ClassVar[type[ConfigError]] = ConfigError
    """What this model's checks raise (a one-line message naming the flag)."""

    @staticmethod
    def flag(name: str) -> str:
        """The command-line flag of field ``name`` (``max_staleness`` → ``--max-staleness``)."""
        return "--" + name.replace("_", "-")

    @classmethod
    def targets(cls) -> list[tuple[str, tuple[str, ...]]]:
        """(field name, path in the configuration) of every field that sets one (``to``), in field order."""
        out = []
        for name, info in cls.model_fields.items():
            extra = info.json_schema_extra
            if isinstance(extra, dict) and isinstance(extra.get("to"), str):
                out.append((name, tuple(str(extra["to"]).split("."))))
        return out

    @classmethod
    def flags_at(cls, loc: tuple[str, ...]) -> str:
        """The flag(s) to fix for a configuration error at ``loc``: the options that set a field inside
        ``loc`` (``--batch-policy/--batch-size/--group-size`` for a cross-field batch check), else the
        option whose field contains it; ``""`` for a check of the whole configuration or of a section
        that more than three options set (its message names the flags itself)."""
        if not loc:
            return ""
        targets = cls.targets()
        inside = [name for name, path in targets if path[: len(loc)] == loc]
        if not inside:
            around = [(len(path), name) for name, path in targets if loc[: len(path)] == path]
            inside = [max(around)[1]] if around else []
        if len(inside) > 3:  # a check across a whole section (e.g. training): its message names the flags
            return ""
        return "/".join(cls.flag(name) for name in inside) or ".".join(loc)

    @classmethod
    def invalid(cls, exc: ValidationError) -> ConfigError:
        """The first error of validating the configuration, as one line naming the flag(s) to fix."""
        err = exc.errors()[0]
        where = cls.flags_at(tuple(str(p) for p in err["loc"]))
        message = str(err["msg"]).removeprefix("Value error, ")
        return cls.error(f"{where}: {message}" if where else message)


class ServeOptions(FlagOptions):
    """``swarm serve``'s options, one field per flag (``max_staleness`` is ``--max-staleness``): the one
    place their names, defaults and help live. The CLI's signature is generated from these fields, and
    a3r builds one to validate its ``--serve-option`` items in process and to start servers (:meth:`argv`).

    Types are the command line's (strings, numbers); :meth:`to_server_config` builds the typed
    :class:`ServerConfig` and reports what is wrong in one line naming the flag.
    """

    error: ClassVar[type[ConfigError]] = ServeOptionsError

    model: str | None = option(
        None, "Local HF model directory or .gguf file (default: embedded SmolLM2-135M-Instruct).", to="model"
    )
    host: str = option("127.0.0.1", "Interface to bind.", to="host")
    port: int = option(8000, "TCP port (0 picks a free one).", to="port")
    run_dir: Path = option(
        Path("runs/default"),
        "Pool database, checkpoints, metrics and logs; reuse it to resume.",
        to="run_dir",
    )
    admin_token: SecretStr | None = option(
        None,
        "Bearer token for control routes (or env SWARM_ADMIN_TOKEN).",
        to="admin_token",
        cli={"secret": True},
    )
    client_token: list[str] = option(
        [],
        "Client token, repeatable: NAME=TOKEN or TOKEN (or env SWARM_CLIENT_TOKEN). With any, beginning an "
        "episode needs one, and an episode is finished or read only with its key or the token that began it.",
        to="client_tokens",
        cli={"secret": True},
    )
    client_tokens_file: Path | None = option(
        None, "File of client tokens, one NAME=TOKEN or TOKEN a line ('#' starts a comment)."
    )
    max_open_episodes: int | None = option(
        None,
        "Most episodes one client token may hold open (429 beyond).",
        to="limits.open_episodes_per_token",
    )
    max_requests_per_s: float | None = option(
        None,
        "Begins, chat completions, scores and tokenizes per second per client token (429 + Retry-After beyond).",
        to="limits.requests_per_s_per_token",
    )
    max_body_bytes: int = option(
        8 * 1024 * 1024, "Largest request body in bytes (413).", to="limits.max_body_bytes"
    )
    max_header_bytes: int = option(
        64 * 1024,
        "Largest request head (request target and header lines) in bytes (431).",
        to="max_header_bytes",
    )
    max_request_tokens: int | None = option(
        None,
        "Largest max_tokens a chat request may ask for (422). Default: half the model's context window "
        "(4096 at 8192), so one caller cannot hold the engine for the whole context; 0: no cap but the "
        "context window.",
        to="limits.max_tokens",
    )
    max_n: int = option(16, "Largest n (choices) of a chat request (422).", to="limits.max_n")
    max_messages: int = option(2048, "Most messages in a chat request (422).", to="limits.max_messages")
    max_event_subscribers: int = option(
        64, "Most clients following the event stream at once (503).", to="limits.max_event_subscribers"
    )
    dtype: str = option(
        "float32",
        "Weights: float32 | bfloat16 | float16 | auto (bf16 for LoRA where fast); full FT needs float32.",
        to="dtype",
    )
    mixed_precision: str = option(
        "no",
        "Compute: no (float32-exact logprobs) | bf16 | fp16 | auto (bf16 where fast).",
        to="mixed_precision",
    )
    device: str = option("cpu", "torch device, e.g. cpu or cuda", to="device")
    engine: str = option(
        "hf",
        "Inference engine: hf (transformers; static batches) | vllm (vLLM on a CUDA GPU, continuous "
        "batching; needs the project's vllm extra and --device cuda for the trainer beside it).",
        to="engine",
    )
    gpu_memory_utilization: float = option(
        0.3,
        "vllm: fraction of the GPU's memory vLLM takes for weights and KV cache (the trainer uses the "
        "rest; the KV cache is released during each step).",
        to="gpu_memory_utilization",
    )
    trainer: str = option(
        "torch",
        "Trainer backend: torch (in this process, on --device) | verl (verl's FSDP actor in a Ray worker "
        "group; needs the project's verl extra and CUDA GPUs; full fine-tuning or --lora-rank).",
        to="training.backend",
    )
    trainer_gpus: int = option(
        1, "verl: GPUs per node for the FSDP actor.", to="training.verl.n_gpus_per_node"
    )
    trainer_nodes: int = option(
        1, "verl: nodes of the Ray cluster the actor spans.", to="training.verl.nnodes"
    )
    ray_address: str | None = option(
        None,
        "verl: Ray cluster to join ('auto' on a cluster node; default: start a local Ray).",
        to="training.verl.ray_address",
    )
    verl_weight_sync: str = option(
        "gather",
        "verl: how weights reach the engine: gather (through Ray into the server's copy) | direct (buckets "
        "from the actor's GPU into vLLM, checksummed, time-bounded; --engine vllm: CUDA IPC when vLLM shares "
        "the actor's GPU 0, else an NCCL broadcast) | ipc | broadcast (either one, forced).",
        to="training.verl.weight_sync",
    )
    max_batch_size: int = option(32, "Most sequences sampled together.", to="max_batch_size")
    threads: int | None = option(
        None, "torch CPU threads (default: one per core; 1 on a shared machine).", to="torch_threads"
    )
    episode_timeout: float = option(
        600.0, "Reclaim open episodes idle this many seconds.", to="episode_timeout_s"
    )
    prepare_timeout: float = option(
        60.0,
        "Multi-server finish: resolve a member still prepared this many seconds after it was stored (the "
        "primary aborts, a secondary follows its primary).",
        to="prepare_timeout_s",
    )
    train: bool = option(True, "Train on pooled episodes (or only serve and record).", to="training.enabled")
    batch_policy: str = option(
        "tasks",
        "episodes | tasks | informative_tasks | all_clients_ready | any_client_ready",
        to="training.batch.policy",
    )
    batch_size: int = option(
        8,
        "B: groups (tasks) per step, or episodes/G for the episodes policy.",
        to="training.batch.batch_size",
    )
    group_size: int = option(8, "G: episodes per task (GRPO group).", to="training.batch.group_size")
    lr: float = option(1e-5, "AdamW learning rate.", to="training.trainer.lr")
    lora_rank: int = option(
        0, "LoRA rank; 0 trains all weights.", to="training.trainer.lora.r", cli={"min": 0}, ge=0
    )
    kl_coef: float = option(
        0.0, "β of the KL penalty to the reference policy.", to="training.trainer.kl_coef"
    )
    clip_eps: float = option(
        0.2,
        "ε of the PPO clip ratio range [1 − ε, 1 + ε] (sets ε_low and ε_high).",
        to="training.trainer.clip_eps_low",
        ge=0.0,
        lt=1.0,
    )
    ppo_epochs: int = option(1, "Passes over each batch per step.", to="training.trainer.ppo_epochs", ge=1)
    minibatches: int = option(
        1,
        "Optimizer updates per pass (the batch is split into this many).",
        to="training.trainer.minibatches",
        ge=1,
    )
    tis_cap: float | None = option(
        None,
        "C of truncated importance sampling min(π_old/μ, C) against sampler mismatch (off).",
        to="training.trainer.tis_cap",
    )
    micro_batch_size: int = option(
        4, "Sequences per forward/backward pass.", to="training.trainer.micro_batch_size"
    )
    tenants: int = option(
        0,
        "Host up to N LoRA tenants over the frozen base (created over the control API; needs --lora-rank; "
        "with --engine vllm also --dtype bfloat16, float16 or auto); 0: one policy.",
        to="tenants",
        cli={"min": 0},
        ge=0,
    )
    tenant_overlap: bool = option(
        False,
        "hf engine with --tenants: keep sampling the other tenants during a tenant's step (a sampling copy "
        "of the adapters over the same base weights).",
        to="tenant_overlap",
    )
    checkpoint_every: int | None = option(
        None,
        "Save a checkpoint every N steps (default 1: every step, written in the background; 1 loses no "
        "step on a crash).",
        to="training.checkpoint_every",
    )
    max_steps: int | None = option(
        None, "Stop training after N steps (keep serving).", to="training.max_steps"
    )
    drain_timeout: float = option(
        120.0, "Seconds open episodes may finish once a batch is ready.", to="training.drain_timeout_s"
    )
    merge: str = option(
        "token",
        "token | text: join calls into samples by exact token prefix, or also when the rendered text "
        "continues (templates that strip <think> from earlier turns).",
        to="training.merge",
    )
    max_staleness: int | None = option(
        None,
        "Asynchronous training: no drain; episodes admitted during steps while at most (K+1)·B·G are ahead "
        "of the trainer; open episodes K versions behind are aborted (pair with --tis-cap). Default: "
        "synchronous.",
        to="training.max_staleness",
    )
    client_timeout: float = option(
        120.0,
        "Voting policies: a client silent this many seconds (no episode, heartbeat or vote) stops counting "
        "as active, so a dead client stops blocking all_clients_ready.",
        to="training.client_timeout_s",
    )
    quota: list[str] = option(
        [], "Family share, repeatable: --quota math=0.4 --quota code=0.6", to="training.quotas"
    )
    teacher_url: str | None = option(
        None,
        "On-policy distillation: base URL of a teacher with this model's tokenizer, another swarm server or "
        "vLLM's OpenAI server (its credential: env SWARM_TEACHER_TOKEN or --teacher-token-file).",
        to="training.distill.teacher_url",
        cli={"decls": ["--teacher", "--teacher-url"]},
    )
    teacher_token: SecretStr | None = option(
        None,
        "Bearer credential for the teacher (or env SWARM_TEACHER_TOKEN; a flag shows in ps).",
        to="teacher_token",
        cli={"secret": True, "envvar": "SWARM_TEACHER_TOKEN"},
    )
    teacher_token_file: Path | None = option(None, "File holding the teacher's bearer credential (one line).")
    distill: str = option(
        "pure",
        "With --teacher: pure (the per-token reverse-KL advantage alone) | mixed (task advantage + "
        "--distill-coef × it).",
        to="training.distill.mode",
    )
    distill_coef: float = option(
        1.0,
        "mixed distillation: weight of the reverse-KL advantage (live: PATCH /api/v1/config distill_coef).",
        to="training.distill.coef",
    )
    teacher_wait: float = option(
        30.0,
        "With --teacher: seconds a ready batch waits for the teacher's scores; episodes still unscored stay "
        "pooled for a later step.",
        to="training.distill.wait_s",
    )
    training_config: Path | None = option(
        None, "JSON file with a full TrainingConfig (overrides the options above)."
    )
    log_level: LogLevel = option(LogLevel.info, "Server log level.")
    access_log: bool = option(
        False,
        "Log every HTTP request (uvicorn's access log, on stdout). Off by default: it costs about 7 % of "
        "the server's CPU per episode; episodes, steps and errors are logged either way.",
    )

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any]) -> ServeOptions:
        """Options from ``{flag name: value}`` as a user writes them (``{"max-staleness": "1"}``; a
        leading ``--`` is allowed; ``None`` leaves an option at its default).

        Raises:
            ServeOptionsError: an unknown option (``No such option: --bogus``) or a value of the wrong
                type (``Invalid value for '--max-staleness': …``).
        """
        values: dict[str, Any] = {}
        for key, value in flags.items():
            name = key.removeprefix("--").replace("-", "_")
            if name not in cls.model_fields:
                raise ServeOptionsError(f"No such option: {cls.flag(name)}")
            if value is not None:
                values[name] = [value] if name in _LISTS and isinstance(value, str) else value
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            name = str(err["loc"][0])
            raise ServeOptionsError(
                f"Invalid value for '{cls.flag(name)}': {values.get(name)!r}: {err['msg']}"
            ) from None

    def argv(self) -> list[str]:
        """The ``swarm serve`` flags of the options set here (booleans as ``--train``/``--no-train``,
        ``None`` left out), in field order. Tokens are never on the command line (``ps`` shows it): pass
        them in the environment as ``SWARM_ADMIN_TOKEN`` and ``SWARM_CLIENT_TOKEN``, or in a
        ``--client-tokens-file``."""
        out: list[str] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name not in self.model_fields_set or value is None or name in _SECRETS:
                continue
            flag = self.flag(name)
            if isinstance(value, bool):
                out.append(flag if value else f"--no-{flag.removeprefix('--')}")
            elif isinstance(value, list):
                for item in value:
                    out += [flag, str(item)]
            elif isinstance(value, float):
                out += [flag, str(int(value)) if value.is_integer() else repr(value)]
            else:
                out += [flag, str(value.value if isinstance(value, StrEnum) else value)]
        return out

    def to_server_config(self) -> ServerConfig:
        """The :class:`ServerConfig` these options describe (nothing is loaded or written).

        Raises:
            ServeOptionsError: an option is invalid, in one line naming it (``--lr: Input should be less
                than or equal to 1``; a ``--training-config`` file's errors name the file and field).
        """
        from swarm.config import ServerConfig

        if self.tenant_overlap and not self.tenants:  # fresh-s5 #10: the flag did nothing, silently
            raise ServeOptionsError(
                "--tenant-overlap: needs --tenants N (it keeps sampling the other tenants during a tenant's "
                "step); this server hosts no tenants"
            )
        if self.max_request_tokens is not None and self.max_request_tokens < 0:  # (the cap's own rule: >= 1)
            raise ServeOptionsError(
                f"--max-request-tokens: must be 0 (no cap but the context window) or a cap of at least 1, "
                f"not {self.max_request_tokens}"
            )
        values: dict[str, Any] = {
            "model": self.model,
            "host": self.host,
            "port": self.port,
            "run_dir": self.run_dir,
            "admin_token": self.admin_token,
            "teacher_token": self._teacher_token(),
            "client_tokens": self._client_tokens(),
            "limits": {
                "open_episodes_per_token": self.max_open_episodes,
                "requests_per_s_per_token": self.max_requests_per_s,
                "max_body_bytes": self.max_body_bytes,
                "max_tokens": self.max_request_tokens or None,  # 0: no cap but the context window
                "max_n": self.max_n,
                "max_messages": self.max_messages,
                "max_event_subscribers": self.max_event_subscribers,
            },
            "dtype": self.dtype,
            "mixed_precision": self.mixed_precision,
            "device": self.device,
            "engine": self.engine,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_batch_size": self.max_batch_size,
            "torch_threads": self.threads,
            "episode_timeout_s": self.episode_timeout,
            "prepare_timeout_s": self.prepare_timeout,
            "tenants": self.tenants,
            "tenant_overlap": self.tenant_overlap,
            "max_header_bytes": self.max_header_bytes,
            "request_tokens_share": DEFAULT_REQUEST_TOKENS_SHARE if self.max_request_tokens is None else None,
        }
        try:
            values["training"] = self._training()
            return ServerConfig.model_validate(values)
        except ValidationError as exc:
            if exc.title != "TrainingConfig":
                raise self.invalid(exc) from None
            err = exc.errors()[0]  # a --training-config file, validated on its own
            where = f"--training-config {self.training_config}: {'.'.join(str(p) for p in err['loc'])}"
            raise ServeOptionsError(f"{where}: {str(err['msg']).removeprefix('Value error, ')}") from None

    def _training(self) -> TrainingConfig | dict[str, Any]:
        """The training section: the ``--training-config`` file, else the options (plain values)."""
        from swarm.config import TrainingConfig

        if self.training_config is not None:
            text = _read_option_file(f"--training-config {self.training_config}", self.training_config)
            return TrainingConfig.model_validate_json(text)
        trainer: dict[str, Any] = {
            "lr": self.lr,
            "kl_coef": self.kl_coef,
            "clip_eps_low": self.clip_eps,
            "clip_eps_high": self.clip_eps,
            "ppo_epochs": self.ppo_epochs,
            "minibatches": self.minibatches,
            "tis_cap": self.tis_cap,
            "micro_batch_size": self.micro_batch_size,
        }
        if self.lora_rank > 0:
            trainer["lora"] = {"r": self.lora_rank, "alpha": 2 * self.lora_rank}
        shares = self._shares()
        fields = type(self).model_fields
        stray = [
            n for n in ("distill", "distill_coef", "teacher_wait") if getattr(self, n) != fields[n].default
        ]
        if self.teacher_url is None and stray:
            raise ServeOptionsError(f"{self.flag(stray[0])}: distillation needs --teacher URL")
        if self.teacher_url is not None:
            self._check_distill()
        return {
            "enabled": self.train,
            "backend": self.trainer,
            "verl": {
                "n_gpus_per_node": self.trainer_gpus,
                "nnodes": self.trainer_nodes,
                "ray_address": self.ray_address,
                "weight_sync": self.verl_weight_sync,
            },
            "batch": {
                "policy": self.batch_policy,
                "batch_size": self.batch_size,
                "group_size": self.group_size,
            },
            "trainer": trainer,
            "quotas": {"shares": shares, "slack": self.group_size} if shares else None,
            **({} if self.checkpoint_every is None else {"checkpoint_every": self.checkpoint_every}),
            "max_steps": self.max_steps,
            "drain_timeout_s": self.drain_timeout,
            "max_staleness": self.max_staleness,
            "merge": self.merge,
            "client_timeout_s": self.client_timeout,
            "distill": None
            if self.teacher_url is None
            else {
                "teacher_url": self.teacher_url,
                "mode": self.distill,
                "coef": self.distill_coef,
                "wait_s": self.teacher_wait,
            },
        }

    def _check_distill(self) -> None:
        """Refuse distillation options that would be silently ignored, and a teacher URL of a wrong shape.

        Raises:
            ServeOptionsError: in one line naming the option.
        """
        from urllib.parse import urlsplit

        url = str(self.teacher_url)
        try:
            scheme, host = urlsplit(url).scheme, urlsplit(url).hostname
        except ValueError:  # e.g. an invalid port or IPv6 address
            scheme, host = "", None
        if scheme not in ("http", "https") or not host:
            raise ServeOptionsError(f"--teacher {url}: not an http:// or https:// URL with a host")
        if not self.train:
            raise ServeOptionsError(
                "--no-train: distillation (--teacher) trains the student; drop one of them"
            )
        if self.distill == "pure" and self.distill_coef != type(self).model_fields["distill_coef"].default:
            raise ServeOptionsError(
                "--distill-coef only weighs the reverse KL in mixed mode (add --distill mixed, or drop it)"
            )

    def _teacher_token(self) -> SecretStr | None:
        """The teacher's credential: ``--teacher-token-file``'s first line, else ``--teacher-token`` (or
        env ``SWARM_TEACHER_TOKEN``)."""
        if self.teacher_token_file is None:
            return self.teacher_token
        where = f"--teacher-token-file {self.teacher_token_file}"
        text = _read_option_file(where, self.teacher_token_file).strip()
        if not text or "\n" in text:
            raise ServeOptionsError(f"{where}: expected the credential alone on one line")
        return SecretStr(text)

    def _client_tokens(self) -> dict[str, str]:
        """Client tokens by name, from ``--client-token`` and ``--client-tokens-file`` (a bare TOKEN is
        named ``client-N``, N counting the bare tokens from 1 in the order given and skipping names given
        explicitly: stable across restarts given the same options)."""
        items = [(self.flag("client_token"), item) for item in self.client_token]
        if self.client_tokens_file is not None:
            where = f"--client-tokens-file {self.client_tokens_file}"
            lines = _read_option_file(where, self.client_tokens_file).splitlines()
            for number, line in enumerate(lines, 1):
                text = line.split("#", 1)[0].strip()
                if text:
                    items.append((f"{where} line {number}", text))
        tokens: dict[str, str] = {}
        named = {item.partition("=")[0].strip() for _, item in items if "=" in item}
        numbers = (f"client-{n}" for n in itertools.count(1))
        for where, item in items:
            name, sep, token = item.partition("=")
            if not sep:  # named by its place, never by the secret (a hash of it would let guesses be checked)
                name, token = next(n for n in numbers if n not in named), item
            name, token = name.strip(), token.strip()
            if not name or len(token) < MIN_TOKEN_CHARS:  # never echo the token: the message names where
                raise ServeOptionsError(  # it came from
                    f"{where}: expected NAME=TOKEN or TOKEN, the token at least {MIN_TOKEN_CHARS} characters"
                )
            if name in tokens:
                raise ServeOptionsError(f"{where}: the name {name!r} is given twice")
            tokens[name] = token
        return tokens

    def _shares(self) -> dict[str, float]:
        shares: dict[str, float] = {}
        for item in self.quota:
            family, sep, share = item.partition("=")
            if not sep or not family:
                raise ServeOptionsError(f"--quota {item!r}: expected FAMILY=SHARE, e.g. math=0.4")
            if family in shares:
                raise ServeOptionsError(f"--quota {item!r}: family {family!r} is given twice")
            try:
                shares[family] = float(share)
            except ValueError:
                raise ServeOptionsError(f"--quota {item!r}: {share!r} is not a number") from None
        return shares

    def warnings(self, config: ServerConfig) -> list[str]:
        """Valid options that do less than they may seem to, one line each, for ``swarm serve`` to print
        at start and with ``--check``: a per-client-token limit on a server started without client tokens
        limits nobody until the admin adds one (`swarm.protocol.Limits`: episodes begun without a token are
        not limited per token; fresh-s5 #13)."""
        if config.client_tokens:
            return []
        given = [
            flag
            for flag, value in (
                ("--max-requests-per-s", self.max_requests_per_s),
                ("--max-open-episodes", self.max_open_episodes),
            )
            if value is not None
        ]
        if not given:
            return []
        return [
            f"{' and '.join(given)} {'limits' if len(given) == 1 else 'limit'} each client token, and this server "
            "has none yet: anonymous begins and completions are not limited (add tokens with --client-token "
            "NAME=TOKEN, --client-tokens-file, or live with POST /api/v1/client-tokens)"
        ]

    def check(self, *, unfit: list[str] | None = None) -> ServerConfig:
        """Everything ``swarm serve --check`` checks before loading a model: :meth:`to_server_config`,
        then that the model path can be a model, the device is usable and the run dir writable.

        Args:
            unfit: ``None``: a problem of this machine (`MachineUnfit`) is raised like any other. A list
                (a dry run, which starts nothing): each such problem is appended to it, one line each, and
                the other checks go on.

        Raises:
            ServeOptionsError: the first problem, in one line naming the option.
        """
        from swarm.engine.model_loading import check_model_path

        def here(check: Callable[..., None], *args: Any) -> None:
            try:
                check(*args)
            except MachineUnfit as exc:
                if unfit is None:
                    raise
                unfit.append(str(exc))

        config = self.to_server_config()
        if self.model is not None:
            try:
                check_model_path(self.model)
            except SwarmError as exc:
                raise ServeOptionsError(f"--model {exc}") from None
        here(check_device, self.device)
        if config.engine == "vllm":
            here(_check_vllm_installed)
            _check_vllm_device(config.device)
        if config.training.enabled and config.training.backend == "verl":
            here(_check_verl, config.training.verl.ray_address)
        _check_run_dir(self.run_dir)
        return config


_SECRETS = frozenset(name for name, info in ServeOptions.model_fields.items() if cli_spec(info).get("secret"))
"""Options never written into :meth:`ServeOptions.argv` (they travel in the environment)."""
_LISTS = frozenset(
    name for name, info in ServeOptions.model_fields.items() if get_origin(info.annotation) is list
)
"""Repeatable options."""


def _read_option_file(where: str, path: Path) -> str:
    """The UTF-8 text of a file an option names.

    Raises:
        ServeOptionsError: ``{where}: why`` (unreadable, not UTF-8) in one line.
    """
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ServeOptionsError(f"{where}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ServeOptionsError(f"{where}: not UTF-8 text") from None


def check_device(device: str) -> None:
    """Raise unless ``device`` names a torch device this process can use (imports torch).

    Raises:
        ServeOptionsError: ``--device …: why`` in one line.
    """
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ServeOptionsError(
            f"--device {device}: not a torch device (e.g. cpu, cuda, cuda:1, mps)"
        ) from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise MachineUnfit(f"--device {device}: this torch build sees no CUDA device")
        if parsed.index is not None and parsed.index >= count:
            raise MachineUnfit(
                f"--device {device}: only {count} CUDA device(s) visible (cuda:0…cuda:{count - 1})"
            )
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise MachineUnfit(f"--device {device}: MPS is not available here")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise ServeOptionsError(f"--device {device}: the hf engine runs on cpu, cuda or mps")


def _check_vllm_installed() -> None:
    """Raise unless vLLM can run here (installed, a CUDA GPU).

    Raises:
        MachineUnfit: ``--engine vllm: why`` in one line.
    """
    from swarm.engine.vllm import check_vllm_available

    try:
        check_vllm_available()
    except SwarmError as exc:
        raise MachineUnfit(str(exc)) from None


def _check_vllm_device(device: str) -> None:
    """Raise unless the trainer of a ``vllm`` server is on the GPU.

    Raises:
        ServeOptionsError: ``--engine vllm: use --device cuda`` in one line.
    """
    if not device.startswith("cuda"):
        raise ServeOptionsError(
            f"--engine vllm: the trainer updates its copy of the weights beside vLLM on the GPU; "
            f"use --device cuda (not {device})"
        )


def _check_verl(ray_address: str | None) -> None:
    """Raise unless the ``verl`` trainer backend can run: verl 0.9.1 and what it imports, and CUDA GPUs
    here unless the actor runs on a Ray cluster (``--ray-address``).

    Raises:
        MachineUnfit: ``--trainer verl: why …`` in one line.
    """
    import torch

    from swarm.train.verl_backend import check_verl_available

    try:
        check_verl_available()
    except SwarmError as exc:
        raise MachineUnfit(str(exc)) from None
    if ray_address is None and not torch.cuda.is_available():
        raise MachineUnfit(
            "--trainer verl: verl's FSDP actor needs CUDA GPUs and this machine has none "
            "(or give --ray-address of a Ray cluster that has them)"
        )
    if ray_address is not None:
        from swarm.train.verl_backend import check_ray_address

        try:
            check_ray_address(ray_address)
        except SwarmError as exc:
            raise ServeOptionsError(str(exc)) from None


def _check_run_dir(run_dir: Path) -> None:
    """Raise unless ``run_dir`` is a folder, or can become one, that this user can write.

    Tried, not guessed from permission bits (root passes ``os.access`` on ``/proc``, where ``mkdir``
    fails): the missing folders are created and removed again, or a file is created in an existing
    folder and removed, so a check leaves nothing behind.
    """
    path = run_dir.expanduser()
    if path.exists() and not path.is_dir():
        raise ServeOptionsError(f"--run-dir {run_dir}: exists and is not a folder")
    missing = [p for p in (path, *path.parents) if not p.exists()]
    try:
        if missing:
            path.mkdir(parents=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ServeOptionsError(f"--run-dir {run_dir}: cannot write there ({reason})") from None
    finally:
        for folder in missing:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()
