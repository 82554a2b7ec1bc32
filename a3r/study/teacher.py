"""The teacher of on-policy distillation, as a request names it (issue 38).

A request distils a teacher into the served model ("distil http://host:8001 into the embedded model
on arithmetic", "does distilling ./runs/teacher/checkpoints/step-000020 beat GRPO alone on
arithmetic"): the teacher is the URL of a server that scores token ids (another swarm server's
``POST /v1/score``, or vLLM's OpenAI server) or a checkpoint directory that a3r serves itself as a
teacher swarm server (`a3r.swarmops.teacher`). `read_teacher` takes it out of the request, so that a
URL or a path never names a task, a dataset or a setting, and every provider's plan must carry it
(`a3r.study.request.check_request`).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel

from a3r.errors import PlanError
from a3r.study.settings import serve_flags
from swarm.client import ModelLoadError, ServeOptions, check_model_path

__all__ = [
    "DISTILL_WORDS",
    "distill_serve_line",
    "is_url",
    "read_mode",
    "read_teacher",
    "teacher_text",
]

DISTILL_WORDS = re.compile(r"\b(?:distil(?:l)?(?:ation|ing|ed|s)?|teacher)\b", re.IGNORECASE)
"""Words that ask for distillation ("distil", "distill", "distillation", "distilling", "teacher")."""

_PAIR = re.compile(r"(?<![\w.-])teacher\s*=\s*([^\s,;]+)", re.IGNORECASE)
"""``teacher=VALUE`` written as a pair."""

_URL = re.compile(r"\bhttps?://[^\s,;]+", re.IGNORECASE)
"""A URL (http or https) standing in the request."""

_PATH = re.compile(r"(?<![\w:/.-])(?:~|\.{1,2})?/[^\s,;]+")
"""A path token: absolute (``/runs/t``), relative (``./t``, ``../t``) or home (``~/t``)."""

_MIXED = re.compile(r"\bmixed\b|\b(?:with|plus|and)\s+(?:the\s+)?(?:task\s+)?reward\b", re.IGNORECASE)
"""Words that ask for mixed distillation (the task reward's advantage plus the teacher's)."""


def is_url(teacher: str) -> bool:
    """Whether ``teacher`` is a server URL (else a checkpoint directory)."""
    return teacher.lower().startswith(("http://", "https://"))


def _checked(found: str) -> str:
    """A teacher as written, checked: a URL with a host (trailing ``/`` and sentence punctuation
    dropped), or an existing directory (made absolute: runs start elsewhere).

    Raises:
        PlanError: A URL without a host, or a path that is not a directory; one line.
    """
    found = found.rstrip(".)!?")
    if is_url(found):
        parts = urlsplit(found)
        if not parts.hostname:
            raise PlanError(f"teacher {found!r}: a URL needs a host, e.g. http://127.0.0.1:8001")
        return found.rstrip("/")
    path = Path(found).expanduser()
    if not path.is_dir():
        raise PlanError(
            f"teacher {found!r}: no such checkpoint directory; name a teacher server's URL "
            "(http://host:port) or a checkpoint directory (e.g. <run dir>/checkpoints/step-000020)"
        )
    _check_servable(path, found)
    return str(path.resolve())


_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
"""Weight files a Hugging Face model folder holds (``model.safetensors``, ``pytorch_model.bin``, shards)."""


def _check_servable(path: Path, found: str) -> None:
    """Refuse a checkpoint directory ``swarm serve --model`` cannot serve: it needs a full Hugging
    Face model (``config.json`` and weights); a LoRA checkpoint (``adapter_config.json``, adapters only)
    must be merged into a full model first.

    Raises:
        PlanError: What the folder lacks; one line.
    """
    weights = [
        f
        for pattern in _WEIGHTS
        for f in path.glob(pattern)
        if not f.name.startswith(("adapter_", "trainer_state"))
    ]
    if (path / "adapter_config.json").exists() and not weights:
        raise PlanError(
            f"teacher {found!r} is a LoRA checkpoint (adapters only), not a model swarm serve can load: "
            "merge it into a full model folder first (PeftModel.from_pretrained(base, dir)."
            "merge_and_unload().save_pretrained(out), as bench/distill.py's merged_teacher does)"
        )
    try:
        check_model_path(path)
    except ModelLoadError as exc:
        raise PlanError(
            f"teacher {found!r}: {exc}; a teacher folder must be a Hugging Face model folder "
            "(config.json and weights, e.g. model.safetensors)"
        ) from exc
    if not weights:
        raise PlanError(
            f"teacher {found!r}: no weights (model.safetensors or pytorch_model.bin) beside its config.json; "
            "a teacher folder must be a full Hugging Face model folder"
        )


def _check_one_teacher(found: list[str]) -> None:
    """Refuse a request that names two or more teachers: a run distils one teacher.

    Raises:
        PlanError: One line naming them.
    """
    named = list(dict.fromkeys(f.rstrip(".)!?").rstrip("/") for f in found))
    if len(named) > 1:
        raise PlanError(
            f"the request names {len(named)} teachers ({', '.join(named)}); a run distils one teacher: ask "
            "one question per teacher"
        )


def read_teacher(request: str) -> tuple[str | None, str]:
    """The teacher a request names and the request without it.

    The teacher is a ``teacher=VALUE`` pair, else, when the request asks for distillation
    (`DISTILL_WORDS`), the URL or path in it. The teacher's text is replaced by ``the teacher``,
    so that nothing in a URL or a path is read as a task, a dataset or a setting.

    Args:
        request: The user's request, as written (paths keep their case).

    Returns:
        ``(teacher, rest)``: the teacher (a URL without a trailing ``/``, or an absolute directory
        path), or ``None`` when the request names none; and the request with it replaced.

    Raises:
        PlanError: The request asks for distillation but names no teacher or two or more, names a URL
            without a host, or a path that is not a servable model directory; one line.
    """
    pairs = list(_PAIR.finditer(request))
    _check_one_teacher([p.group(1) for p in pairs])
    if pairs:
        pair = pairs[0]
        rest = request[: pair.start()] + "teacher" + request[pair.end() :]
        return _checked(pair.group(1)), rest
    if not DISTILL_WORDS.search(request):
        return None, request
    # a URL or path written as another pair's value (``dataset=/data/t.jsonl``) is not a teacher
    found_all = [*_URL.finditer(request), *_PATH.finditer(request)]
    candidates = [c for c in found_all if request[: c.start()].rstrip()[-1:] != "="]
    _check_one_teacher([c.group(0) for c in candidates])
    found = min(candidates, key=lambda c: (not is_url(c.group(0)), c.start()), default=None)
    if found is None:
        raise PlanError(
            "distillation needs a teacher: name its server's URL (http://host:port, a swarm server or "
            "vLLM's OpenAI server) or a checkpoint directory a3r serves itself, e.g. 'distil "
            "http://127.0.0.1:8001 into the embedded model on arithmetic'"
        )
    rest = request[: found.start()] + "the teacher" + request[found.end() :]
    return _checked(found.group(0)), rest


def read_mode(request: str) -> str:
    """``mixed`` when the request asks to keep the task reward beside the teacher ("mixed", "with the
    reward"), else ``pure`` (the teacher's reverse-KL advantage alone)."""
    return "mixed" if _MIXED.search(request) else "pure"


def teacher_text(teacher: str) -> str:
    """The teacher as a plan or a report names it: the URL, or ``checkpoint <dir>``."""
    return teacher if is_url(teacher) else f"checkpoint {teacher}"


DISTILL_FLAGS = ("teacher-url", "distill", "distill-coef")
"""The ``swarm serve`` options of distillation (`a3r.study.settings.serve_flags` sets them)."""

_SERVED = "http://127.0.0.1:1"
"""Stands for the URL of the teacher server a3r starts, in `distill_serve_line`."""


def distill_serve_line(settings: BaseModel) -> str:
    """The ``swarm serve`` options a distilling run adds, as a dry run shows them (``--teacher URL
    --distill pure --distill-coef 1``), with the teacher server a3r starts for a checkpoint directory.

    Args:
        settings: A `a3r.study.plans.TrainingSettings` with a teacher (its ``distill`` is taken as on:
            a research question's distillation arm).
    """
    on = settings.model_copy(update={"distill": True})
    flags = {k: v for k, v in serve_flags(on).items() if k in DISTILL_FLAGS}
    teacher = str(flags["teacher-url"])
    served = not is_url(teacher)
    argv = ServeOptions.from_flags({**flags, "teacher-url": _SERVED if served else teacher}).argv()
    line = "swarm serve " + " ".join(argv)
    if served:
        line = line.replace(_SERVED, "<its URL>")
        line = f"teacher server: swarm serve --model {teacher} --no-train; student: {line}"
    return line
