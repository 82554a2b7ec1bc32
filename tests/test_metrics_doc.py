"""docs/METRICS.md defines every metric the server logs: each field of a step's metrics row
(``ServerStepMetrics``, its ``StepTimings``) and each event kind the server emits is named on the page."""

from __future__ import annotations

import re
from pathlib import Path

from swarm.protocol import EpisodeStatus, ServerStepMetrics, StepTimings

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "METRICS.md"
_EMIT = re.compile(r"""\.emit\(\s*["']([a-z_]+\.[a-z_]+)["']""")


def _named() -> set[str]:
    """Every `` `name` `` written on the page."""
    return set(re.findall(r"`([^`\s]+)`", PAGE.read_text(encoding="utf-8")))


def test_every_step_metric_is_defined() -> None:
    named = _named()
    fields = [f for f in ServerStepMetrics.model_fields if f != "time_s"]
    fields += [f"time_s.{f}" for f in StepTimings.model_fields]
    assert len(fields) > 30  # the models were read
    missing = [f for f in fields if f not in named]
    assert not missing, f"docs/METRICS.md does not define: {missing}"


def emitted_kinds(root: Path) -> set[str]:
    """The event kinds written literally in ``emit("kind", …)`` calls under ``root``."""
    return {
        m.group(1) for path in root.rglob("*.py") for m in _EMIT.finditer(path.read_text(encoding="utf-8"))
    }


def test_every_event_kind_is_defined() -> None:
    kinds = emitted_kinds(ROOT / "swarm")
    assert {"train.step", "server.started", "checkpoint.saved"} <= kinds  # the pattern finds calls
    # episode.<status> is emitted with the status an episode ended (or was prepared) with (server/episodes.py)
    kinds |= {f"episode.{s.value}" for s in EpisodeStatus if s is not EpisodeStatus.OPEN}
    missing = sorted(kinds - _named())
    assert not missing, f"docs/METRICS.md does not define the event kinds: {missing}"


def test_the_pattern_finds_a_planted_emit(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text('events.emit(\n    "made.up", "x")\nemit("no_dot")\n', encoding="utf-8")
    assert emitted_kinds(tmp_path) == {"made.up"}
