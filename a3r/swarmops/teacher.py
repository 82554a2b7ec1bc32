"""The teacher server of a distilling run (issue 38): a checkpoint directory served by a3r itself.

A plan's teacher (`a3r.study.plans.TrainingSettings.teacher`) is a URL, which the student server
calls as it is (its credential, if any, from the environment's ``SWARM_TEACHER_TOKEN``), or a
checkpoint directory: then a run that distils first starts ``swarm serve --model <dir> --no-train`` on
loopback (`start_teacher`), and its student server gets that server's URL as ``--teacher`` and its
client token as ``SWARM_TEACHER_TOKEN`` (`student_env`; ``POST /v1/score`` takes a client token). The
teacher server lives as long as the student's (`teacher_key` names it among the context's servers).
"""

from __future__ import annotations

from pathlib import Path

from a3r.study.runs import RunSpec
from a3r.study.teacher import is_url
from a3r.swarmops.context import ExecutionContext
from a3r.swarmops.processes import ServerHandle, start_server
from swarm.client import ServeOptions

__all__ = ["TEACHER_OPTIONS", "start_teacher", "student_env", "teacher_key"]

TEACHER_OPTIONS = ("device", "dtype", "mixed-precision", "threads")
"""The user's ``--serve-option`` items a teacher server shares with the student's (where it runs and
at what precision); training options are not its: it trains nothing."""


def teacher_key(server_key: str) -> str:
    """The context's key of the teacher server of the student server ``server_key``."""
    return f"{server_key}-teacher"


def start_teacher(
    spec: RunSpec, ctx: ExecutionContext, server_dir: Path, server_key: str
) -> ServerHandle | None:
    """The teacher server of ``spec``, started when the run distils from a checkpoint directory (and
    not already running); ``None`` when the run does not distil or its teacher is a URL.

    Args:
        spec: The run.
        ctx: The run context; the started server joins ``ctx.servers`` under `teacher_key`.
        server_dir: The teacher server's own run dir.
        server_key: The student server's key.

    Raises:
        SwarmProcessError: The teacher server did not start (its log tail in the message).
        ServeOptionsError: The user's options no longer validate.
    """
    teacher = spec.settings.teacher
    if not spec.settings.distill or teacher is None or is_url(teacher) or spec.purpose == "preflight":
        return None
    key = teacher_key(server_key)
    running = ctx.servers.get(key)
    if running is not None and running.process is not None and running.process.poll() is None:
        return running
    shared = {k: v for k, v in ctx.server_options.items() if k in TEACHER_OPTIONS}
    options = ServeOptions.from_flags({**shared, "train": False})
    handle = start_server(server_dir, model=teacher, options=options)
    ctx.servers[key] = handle
    return handle


def student_env(teacher: ServerHandle | None) -> dict[str, str]:
    """The student server's environment for the teacher a3r started: its client token as
    ``SWARM_TEACHER_TOKEN`` (never on a command line); ``{}`` without one."""
    if teacher is None or teacher.client_token is None:
        return {}
    return {"SWARM_TEACHER_TOKEN": teacher.client_token}
