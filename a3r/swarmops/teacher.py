"""The teacher server of a distilling run (issue 38): a checkpoint directory served by a3r itself.

A plan's teacher (`a3r.study.plans.TrainingSettings.teacher`) is a URL, which the student server
calls as it is (its credential, if any, from the environment's ``SWARM_TEACHER_TOKEN``), or a
checkpoint directory: then a run that distils first starts ``swarm serve --model <dir> --no-train`` on
loopback (`start_teacher`), and its student server gets that server's URL as ``--teacher`` and its
client token as ``SWARM_TEACHER_TOKEN`` (`student_env`; ``POST /v1/score`` takes a client token). The
teacher server lives as long as the student's (`teacher_key` names it among the context's servers).
Before a run starts anything, `check_teacher_answers` asks a URL teacher for ``GET /v1/models``, so
that an unreachable teacher is refused in one line, not found late by the student server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from a3r.errors import PlanError
from a3r.study.runs import RunSpec
from a3r.study.teacher import is_url
from a3r.swarmops.context import ExecutionContext
from a3r.swarmops.processes import ServerHandle, start_server
from swarm.client import ServeOptions

__all__ = [
    "TEACHER_OPTIONS",
    "check_teacher_answers",
    "start_teacher",
    "student_env",
    "teacher_key",
    "teacher_token",
]

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


def teacher_token(server_options: dict[str, Any]) -> str | None:
    """The URL teacher's credential as the student server will send it: the first line of the user's
    ``--serve-option teacher-token-file=PATH``, else the environment's ``SWARM_TEACHER_TOKEN``; ``None``
    without either (an unreadable file is left to ``swarm serve``, which refuses it in one line)."""
    path = server_options.get("teacher-token-file")
    if path is not None:
        try:
            lines = Path(str(path)).expanduser().read_text().splitlines()
        except OSError:
            return None
        return lines[0].strip() if lines else None
    return os.environ.get("SWARM_TEACHER_TOKEN") or None


def check_teacher_answers(url: str, token: str | None, *, timeout_s: float = 5.0) -> None:
    """Refuse a URL teacher that does not answer ``GET /v1/models`` with 200 (a swarm server and vLLM's
    OpenAI server both serve it) within ``timeout_s`` seconds, sending ``token`` as a bearer credential.

    Args:
        url: The teacher server's URL (``http(s)://host:port``).
        token: Its credential, or ``None``.
        timeout_s: Connect and read timeout, seconds.

    Raises:
        PlanError: The teacher is unreachable or answers another status; one line.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(f"{url.rstrip('/')}/v1/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise PlanError(
            f"teacher {url}: cannot reach it ({type(exc).__name__}: {exc}); start the teacher server "
            "first, or name one that runs"
        ) from None
    if response.status_code in (401, 403):
        raise PlanError(
            f"teacher {url}: GET /v1/models answered {response.status_code}: give its credential "
            "(env SWARM_TEACHER_TOKEN or --serve-option teacher-token-file=PATH)"
        )
    if response.status_code != 200:
        raise PlanError(
            f"teacher {url}: GET /v1/models answered {response.status_code}; is it a swarm server or "
            "vLLM's OpenAI server?"
        )
