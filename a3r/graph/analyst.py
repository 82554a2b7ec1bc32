"""The analyst: turns a run's diagnoses into findings with evidence and, for a patchable problem,
proposes a patch (a unified diff of one allow-listed workspace file, with a rationale) for approval.

A run the runner stopped early (``needs_attention``) for which no patch is proposed is continued
without early stopping, so a thread never loops on the same problem. A smoke run that fails, or a run
whose server cannot start, ends the thread (with the evidence) instead of training a broken setup.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from a3r.errors import PatchNotAllowed
from a3r.graph.context import RunContext
from a3r.graph.records import ensure_finding
from a3r.graph.state import PatchReview, ResearchState, first_hypothesis
from a3r.study.analysis import (
    Diagnosis,
    detect_part_exploits,
    detect_reward_hacking,
    on_shared_tasks,
    part_roles,
    reward_range,
)
from a3r.study.effects import LEVEL, EffectVerdict, step_effect, two_sample_effect
from a3r.study.headline import budget_advice
from a3r.study.patches import PATCHABLE, check_allowed, unified_diff
from a3r.study.runs import RunOutcome, RunSpec
from memory import FindingStatus

__all__ = ["analyst", "continuation", "pending_patch_file"]

_CONFIDENCE = {"crash": 0.95, "hang": 0.9, "zero_signal": 0.9, "collapse": 0.8, "stall": 0.8}


def pending_patch_file(workspace: Path, patch_id: int) -> Path:
    """Where a proposed patch's base and new content wait for the decision."""
    return workspace / ".a3r-patches" / f"{patch_id}.json"


def continuation(
    outcome: RunOutcome,
    spec_settings: RunSpec,
    *,
    suffix: str,
    early_stop: bool,
    reward_patch: int | None = None,
) -> RunSpec:
    """A run that continues training on the same server after ``outcome`` (hot-swapped client). After
    a run that finished its steps (a reward patch of a finished run), the continuation trains as many
    steps again, so the patched reward is trained on (the budget still bounds it). ``reward_patch``: the
    patch just applied (else the continuation trains on ``outcome``'s reward)."""
    update: dict[str, object] = {
        "key": f"{outcome.key}-{suffix}",
        "start_step": outcome.steps,
        "early_stop": early_stop,
        "reward_patch": outcome.reward_patch if reward_patch is None else reward_patch,
    }
    if outcome.status == "finished" and outcome.purpose == "train":
        settings = spec_settings.settings
        update["settings"] = settings.model_copy(update={"steps": outcome.steps + settings.steps})
    return spec_settings.model_copy(update=update)


def _spec_of(state: ResearchState, outcome: RunOutcome) -> RunSpec:
    plan = state["plan"]
    return RunSpec(
        key=outcome.key,
        purpose=outcome.purpose,
        seed=outcome.seed,
        settings=plan.training,
        stage=outcome.stage,
        value=outcome.value,
        server_key=f"main-s{outcome.seed}",
        keep_server=outcome.purpose == "smoke",
        stability=plan.stability or RunSpec.model_fields["stability"].get_default(call_default_factory=True),
    )


def _held_out_check(state: ResearchState, outcome: RunOutcome) -> list[tuple[Diagnosis, FindingStatus]]:
    """Reward-hacking signs of a finished training run: its train reward rose while the held-out reward
    (frozen evaluator) fell from the smoke run's baseline to the end of training.

    Each sign comes with its status from `a3r.study.effects`: confirmed only when the train rise (its
    trend over steps, autocorrelation handled) and the held-out fall (over episodes) both clear the
    noise; otherwise the sign is recorded as unconfirmed with the intervals."""
    if outcome.purpose != "train" or outcome.eval is None:
        return []
    runs = [o for o in state["outcomes"] if o.seed == outcome.seed]
    base = next((o.eval for o in runs if o.purpose == "smoke" and o.eval is not None), None)
    curve = [point for o in runs if o.purpose == "train" for point in o.curve]
    if base is None or len(curve) < 2:
        return []
    (base_on, after_on), _ = on_shared_tasks([base, outcome.eval])  # the same held-out tasks
    signs = detect_reward_hacking(
        [curve[0], curve[-1]], [(0, base_on.mean_reward), (1, after_on.mean_reward)]
    )
    if not signs:
        return []
    scale = reward_range(state["plan"].template)
    rise = step_effect([v for _, v in curve], scale=scale)
    fall = two_sample_effect(base_on.rewards, after_on.rewards, scale=scale)
    both = rise.verdict is EffectVerdict.confirmed and fall.verdict is EffectVerdict.confirmed
    status = FindingStatus.confirmed if both else FindingStatus.unconfirmed
    found = []
    for sign in signs:
        summary = (
            f"{status.value}: {sign.summary} (train rise {rise.describe()}; held-out fall before − after "
            f"{fall.describe()})"
        )
        found.append((sign.model_copy(update={"summary": summary}), status))
    return found


def _part_exploits(state: ResearchState, outcome: RunOutcome) -> list[Diagnosis]:
    """One part of the reward exploited in a finished training run (`detect_part_exploits` over this
    run's own part curves, so a patched continuation is judged on its patched reward only), for the
    template's part roles."""
    if outcome.purpose != "train" or outcome.status != "finished":
        return []
    return detect_part_exploits(outcome.parts, part_roles(state["plan"].template))


def analyst(state: ResearchState, runtime: Runtime[RunContext]) -> Command[Literal["approve", "planner"]]:
    """Record findings of the runs the runner just ran (one, or a stage's tenants: ``ran``); decide on
    the last of them: propose a patch when one is warranted."""
    ctx = runtime.context
    ran = state["outcomes"][-max(1, state.get("ran") or 1) :]
    for earlier in ran[:-1]:
        _findings(state, ctx, earlier)
    outcome = ran[-1]
    held_out, exploits = _findings(state, ctx, outcome)
    return _decide(state, ctx, outcome, held_out, exploits)


def _findings(
    state: ResearchState, ctx: RunContext, outcome: RunOutcome
) -> tuple[list[tuple[Diagnosis, FindingStatus]], list[Diagnosis]]:
    """Record a run's findings (its diagnoses, the held-out check, reward-part exploits); returns the
    held-out check and the exploits."""
    study_id = state["study_id"]
    hypothesis = first_hypothesis(state)
    for diagnosis in outcome.diagnoses:
        ensure_finding(
            ctx,
            study_id,
            statement=f"{outcome.key}: {diagnosis.kind.value}: {diagnosis.summary}",
            evidence={"run": outcome.key, **diagnosis.evidence},
            confidence=_CONFIDENCE.get(diagnosis.kind.value, 0.7),
            seeds=[outcome.seed],
            run_ids=[outcome.run_id],
            hypothesis_id=hypothesis if outcome.purpose == "train" else None,
        )
    held_out = _held_out_check(state, outcome)
    for diagnosis, status in held_out:
        ensure_finding(
            ctx,
            study_id,
            statement=f"{outcome.key}: {diagnosis.kind.value}: {diagnosis.summary}",
            evidence={"run": outcome.key, **diagnosis.evidence},
            confidence=LEVEL if status is FindingStatus.confirmed else 0.3,
            status=status,
            seeds=[outcome.seed],
            run_ids=[o.run_id for o in state["outcomes"] if o.seed == outcome.seed],
            hypothesis_id=hypothesis,
        )
    exploits = _part_exploits(state, outcome)
    for diagnosis in exploits:
        ensure_finding(
            ctx,
            study_id,
            statement=f"{outcome.key}: {diagnosis.kind.value}: {diagnosis.summary}",
            evidence={"run": outcome.key, **diagnosis.evidence},
            confidence=LEVEL,
            status=FindingStatus.confirmed,
            seeds=[outcome.seed],
            run_ids=[outcome.run_id],
            hypothesis_id=hypothesis,
        )
    return held_out, exploits


def _decide(
    state: ResearchState,
    ctx: RunContext,
    outcome: RunOutcome,
    held_out: list[tuple[Diagnosis, FindingStatus]],
    exploits: list[Diagnosis],
) -> Command[Literal["approve", "planner"]]:
    """What follows a run: a patch proposal, a stop, a continuation, or the planner."""
    queue = list(state.get("queue") or [])
    patches_done = len(state.get("decisions", []))
    patchable = [d for d in outcome.diagnoses if d.patchable]
    worth_patching = outcome.status != "finished" or outcome.purpose == "smoke"
    # A finished training run whose reward was exploited (a part or held-out reward past the noise)
    # gets a reward patch, and training continues on the patched reward.
    hacked = [*exploits, *(d for d, status in held_out if status is FindingStatus.confirmed)]
    if outcome.purpose == "train" and outcome.status == "finished" and hacked:
        patchable, worth_patching = hacked, True
    if (
        state["mode"] == "vibe"
        and outcome.purpose in ("smoke", "train")
        and worth_patching
        and patchable
        and patches_done < ctx.max_patches
    ):
        for diagnosis in patchable:
            review = _propose(state, ctx, outcome, diagnosis)
            if review is not None:
                return Command(goto="approve", update={"pending_patch": review})
    if outcome.status == "failed_to_start" or (outcome.purpose == "smoke" and outcome.status != "finished"):
        detail = "; ".join(d.summary for d in outcome.diagnoses) or outcome.reason
        text = f"stopped: the {outcome.purpose} run {outcome.key} ended {outcome.status}: {detail}"
        if outcome.status == "budget":  # the line ends with the command that would let it run
            text += f"; {budget_advice(ctx.budget_s)}"
        ctx.say(f"analyst: {text}")
        return Command(goto="planner", update={"queue": [], "conclusion": text, "log": [text]})
    if outcome.status == "needs_attention":
        follow = continuation(outcome, _spec_of(state, outcome), suffix="c", early_stop=False)
        line = f"analyst: no patch for {outcome.key}; training continues unchanged ({follow.key})"
        ctx.say(line)
        return Command(goto="planner", update={"queue": [follow, *queue], "log": [line]})
    return Command(goto="planner")


def _propose(
    state: ResearchState, ctx: RunContext, outcome: RunOutcome, diagnosis: object
) -> PatchReview | None:
    assert isinstance(diagnosis, Diagnosis)
    ws = Path(state["workspace"])
    files = {
        name: (ws / name).read_text(encoding="utf-8") for name in sorted(PATCHABLE) if (ws / name).exists()
    }
    key = ctx.key("analyst", f"patch:{outcome.key}")
    recorded = ctx.ledger.get(key)
    if recorded is None:
        draft = ctx.provider.propose_patch(diagnosis, files, template=state["plan"].template)
        if draft is None:
            ctx.say(
                f"analyst: {diagnosis.kind.value} in {outcome.key}; {ctx.provider.name} has no patch for it"
            )
            return None
        try:
            check_allowed(ws, draft.file)
        except PatchNotAllowed as exc:
            ctx.store.log_event(f"analyst: patch refused: {exc}", study_id=state["study_id"], level="warning")
            ctx.say(f"analyst: patch refused: {exc}")
            return None
        base = files.get(draft.file, "")
        diff = unified_diff(base, draft.new_content, draft.file)
        if not diff:
            return None
        artifact = ctx.store.latest_artifact(state["study_id"], draft.file)
        if artifact is None:
            return None
        patch = ctx.store.propose_patch(
            artifact.id, diff=diff, rationale=draft.rationale, proposed_by=ctx.provider.name[:100]
        )
        pending = pending_patch_file(ws, patch.id)
        pending.parent.mkdir(parents=True, exist_ok=True)
        pending.write_text(
            json.dumps({"file": draft.file, "base": base, "new": draft.new_content}), encoding="utf-8"
        )
        ctx.ledger.put(
            key, {"patch_id": patch.id, "file": draft.file, "rationale": draft.rationale, "diff": diff}
        )
        recorded = ctx.ledger.get(key)
    assert recorded is not None
    review = PatchReview(
        patch_id=int(recorded["patch_id"]),
        file=recorded["file"],
        diff=recorded["diff"],
        rationale=recorded["rationale"],
        diagnosis=diagnosis.summary,
        proposed_by=ctx.provider.name,
    )
    ctx.say(f"analyst: patch {review.patch_id} proposed for {review.file}: {review.rationale}")
    return review
