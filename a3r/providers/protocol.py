"""What the research graph asks of a provider (`ResearchProvider`), answered through the pydantic
schemas of `a3r.study.plans`:

- `ResearchProvider.plan`: a user's request → `PlanDraft` (template, parameters, settings,
  pre-registered hypotheses, and for research questions the sweep and the definition of "stable");
- `ResearchProvider.write_code`: task code for a request no template covers → `GeneratedCode`;
- `ResearchProvider.propose_patch`: a diagnosis plus the workspace files → `PatchDraft` or ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

from a3r.study.analysis import Diagnosis
from a3r.study.plans import (
    GeneratedCode,
    PatchDraft,
    PlanDraft,
)

__all__ = ["Mode", "ResearchProvider"]

Mode = Literal["vibe", "research"]


class ResearchProvider(Protocol):
    """What the graph's nodes ask of a provider."""

    name: str

    def plan(self, request: str, *, mode: Mode) -> PlanDraft:
        """A checked plan (`a3r.study.plans.check_plan`) for ``request``."""
        ...

    def write_code(self, request: str, plan: PlanDraft) -> GeneratedCode:
        """Task code for a request no template covers."""
        ...

    def propose_patch(
        self, diagnosis: Diagnosis, files: Mapping[str, str], *, template: str | None
    ) -> PatchDraft | None:
        """A fix for ``diagnosis`` as the new content of one patchable file, or ``None``."""
        ...
