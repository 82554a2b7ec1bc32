"""What the research graph asks of a provider (`ResearchProvider`), answered through the pydantic
schemas of `a3r.study.plans`:

- `ResearchProvider.plan`: a user's request → `PlanDraft` (template, parameters, settings,
  pre-registered hypotheses, and for research questions the sweep and the definition of "stable");
- `ResearchProvider.write_code`: task code for a request no template covers → `GeneratedCode`; given a
  `CodeFailure` (the previous code and how its check failed), a repaired version of it;
- `ResearchProvider.propose_patch`: a diagnosis plus the workspace files → `PatchDraft` or ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from a3r.study.analysis import Diagnosis
from a3r.study.plans import (
    GeneratedCode,
    PatchDraft,
    PlanDraft,
)

__all__ = ["CodeFailure", "Mode", "ResearchProvider"]

Mode = Literal["vibe", "research"]


class CodeFailure(BaseModel):
    """Generated task code that failed its check, as the provider is shown it for a repair.

    Attributes:
        attempt: Which attempt wrote the code (1 = the first).
        step: The check that failed (`templates.ValidationReport.step`: ``compile``, ``import``,
            ``data``, ``checks`` or ``timeout``).
        detail: What failed: the compiler message, the traceback, or the failing self-checks.
        code: The code that failed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempt: int = Field(ge=1)
    step: str
    detail: str
    code: GeneratedCode


class ResearchProvider(Protocol):
    """What the graph's nodes ask of a provider."""

    name: str

    def plan(self, request: str, *, mode: Mode) -> PlanDraft:
        """A checked plan (`a3r.study.plans.check_plan`) for ``request``, checked against it
        (`a3r.study.request.check_request`: one task, every ``name=value`` pair known and used)."""
        ...

    def write_code(
        self, request: str, plan: PlanDraft, *, failure: CodeFailure | None = None
    ) -> GeneratedCode:
        """Task code for a request no template covers; with ``failure``, the failed code repaired."""
        ...

    def propose_patch(
        self, diagnosis: Diagnosis, files: Mapping[str, str], *, template: str | None
    ) -> PatchDraft | None:
        """A fix for ``diagnosis`` as the new content of one patchable file, or ``None``."""
        ...
