"""Live configuration of a training server: ``PATCH /api/v1/config`` validated, staged and applied.

A patch is checked whole before anything changes (422 with one readable line naming the field).
Sampling defaults, the batch policy, quotas and the loop's own settings change at once; the trainer's
hyper-parameters are staged and handed to the trainer at the start of the next step
(:meth:`LiveConfig.take_trainer_changes`), so a step never sees half a patch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from swarm.batch import BatchConfig, FamilyQuotas
from swarm.config import TrainingConfig, check_weighting
from swarm.errors import RequestError
from swarm.protocol import ConfigPatch, SamplingDefaults
from swarm.server.admission import AdmissionControl
from swarm.train import LIVE_FIELDS, TrainerBackend, TrainerConfig

__all__ = ["TRAINER_FIELDS", "LiveConfig"]

TRAINER_FIELDS = (frozenset(LIVE_FIELDS) & frozenset(ConfigPatch.model_fields)) - {"temperature"}
"""Patch fields that go to the trainer. Not ``temperature``: the patch's is the *sampling* default, while
the trainer's must stay at the temperature the engine records logprobs with (1.0), or every importance
ratio of the next step would be off."""

_BATCH_FIELDS = {"batch_policy": "policy", "batch_size": "batch_size", "group_size": "group_size"}
"""Patch field → `BatchConfig` field."""
_LOOP_FIELDS = {
    "normalize_std": "normalize_std",
    "training_enabled": "enabled",
    "drain_timeout_s": "drain_timeout_s",
    "max_staleness": "max_staleness",
    "checkpoint_every": "checkpoint_every",
    "max_steps": "max_steps",
}
"""Patch field → `TrainingConfig` field."""
_SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens")


@dataclass(frozen=True)
class _Validated:
    """A patch that passed every check, ready to apply."""

    changes: dict[str, Any]
    trainer: dict[str, Any]
    batch: BatchConfig | None
    quotas: FamilyQuotas | Literal[False] | None
    """``False``: the quotas are not changed."""


def _problem(err: Any) -> tuple[str, str | None]:
    """(``"field: message"``, field) of one pydantic error of a staged config; the field is named as in
    the PATCH body where it has a name there."""
    loc = [str(p) for p in err.get("loc", ())]
    field = {"policy": "batch_policy", "shares": "quotas"}.get(loc[0], loc[0]) if loc else None
    message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return (f"{field}: {message}" if field else message), field


def _invalid(message: str, param: str | None = None) -> RequestError:
    return RequestError(f"invalid config change: {message}", status_code=422, param=param)


class LiveConfig:
    """The server's live training and sampling configuration.

    Args:
        config: the training configuration (changed in place).
        trainer: the trainer backend (its live fields; staged changes go to it between steps).
        sampling: the server's sampling defaults (changed in place).
        admission: quotas changes start its window over.
    """

    def __init__(
        self,
        config: TrainingConfig,
        trainer: TrainerBackend,
        sampling: SamplingDefaults,
        admission: AdmissionControl,
    ) -> None:
        self.config = config
        self.trainer = trainer
        self.sampling = sampling
        self.admission = admission
        self._staged_trainer: dict[str, Any] = {}

    def apply(self, patch: ConfigPatch) -> dict[str, Any]:
        """Validate and stage a live config change; returns the fields changed.

        Raises:
            RequestError: the combined configuration is invalid (422).
        """
        validated = self._validate(patch)
        self._staged_trainer.update(validated.trainer)
        if validated.batch is not None:
            self.config.batch = validated.batch
        if validated.quotas is not False:
            self.admission.set_quotas(validated.quotas)
        changes = validated.changes
        for name in _SAMPLING_FIELDS:
            if name in changes:
                setattr(self.sampling, name, changes[name])
        for name, attr in _LOOP_FIELDS.items():
            if name in changes:
                setattr(self.config, attr, changes[name])
        if "distill_coef" in changes and self.config.distill is not None:
            self.config.distill.coef = changes["distill_coef"]  # read when the next step builds its batch
        return changes

    def take_trainer_changes(self) -> None:
        """Hand the staged trainer changes to the trainer (at the start of a step)."""
        if self._staged_trainer:
            self.trainer.update_config(**self._staged_trainer)
            self._staged_trainer.clear()

    def effective(self) -> dict[str, Any]:
        """The configuration the next step will use (staged changes included)."""
        trainer = {**self.trainer.config.model_dump(mode="json"), **self._staged_trainer}
        return {
            "training": {**self.config.model_dump(mode="json", exclude={"trainer"}), "trainer": trainer},
            "sampling": self.sampling.model_dump(),
        }

    # -- checks --------------------------------------------------------------------------------------------
    def _validate(self, patch: ConfigPatch) -> _Validated:
        changes = self._changes(patch)
        trainer_changes = {k: v for k, v in changes.items() if k in TRAINER_FIELDS}
        fixed = sorted(set(trainer_changes) - self.trainer.live_fields)
        if fixed:
            raise _invalid(
                f"{fixed[0]}: the {self.config.backend} trainer fixes it at start "
                f"(live: {', '.join(sorted(self.trainer.live_fields & TRAINER_FIELDS))})",
                fixed[0],
            )
        try:
            if trainer_changes:
                self._check_trainer(trainer_changes)
            batch_changes = {_BATCH_FIELDS[k]: v for k, v in changes.items() if k in _BATCH_FIELDS}
            new_batch = (
                BatchConfig.model_validate({**self.config.batch.model_dump(), **batch_changes})
                if batch_changes
                else None
            )
            quotas: FamilyQuotas | Literal[False] | None = False
            if "quotas" in changes:
                shares = changes["quotas"]
                group = new_batch.group_size if new_batch else self.config.batch.group_size
                quotas = FamilyQuotas(shares=shares, slack=group) if shares else None
        except ValidationError as exc:  # one readable line: "field: what is wrong; …"
            problems = [_problem(err) for err in exc.errors()]
            # A check across fields (group_size 1 with the `tasks` policy) has no location: name the
            # first field of the patch it concerns.
            involved = [name for name in changes if name in _BATCH_FIELDS]
            param = (problems[0][1] if problems else None) or (involved[0] if involved else None)
            raise _invalid("; ".join(p for p, _ in problems), param) from None
        except ValueError as exc:
            raise _invalid(str(exc)) from exc
        return _Validated(changes, trainer_changes, new_batch, quotas)

    def _changes(self, patch: ConfigPatch) -> dict[str, Any]:
        """The patch's fields, refusing explicit nulls and a mode switch."""
        nulls = sorted(name for name in patch.model_fields_set if getattr(patch, name) is None)
        if nulls:
            hint = (
                "; the synchronous/asynchronous mode is set at start (restart without --max-staleness "
                "to train synchronously)"
                if nulls[0] == "max_staleness"
                else ""
            )
            raise _invalid(f"{nulls[0]}: null is not a value (leave a field out to keep it){hint}", nulls[0])
        changes = patch.model_dump(exclude_none=True)
        if "distill_coef" in changes and self.config.distill is None:
            raise _invalid(
                "distill_coef: this server does not distil (start it with --teacher URL)", "distill_coef"
            )
        if (
            "distill_coef" in changes
            and self.config.distill is not None
            and self.config.distill.mode == "pure"
        ):
            raise _invalid(
                "distill_coef only weighs the reverse KL in mixed mode; this server distils pure "
                "(restart it with --distill mixed)",
                "distill_coef",
            )
        if "max_staleness" in changes and self.config.max_staleness is None:
            raise _invalid(
                "max_staleness: this server trains synchronously; "
                "start it with --max-staleness K to run asynchronously",
                "max_staleness",
            )
        return changes

    def _check_trainer(self, trainer_changes: dict[str, Any]) -> None:
        """The trainer's config with the staged and new changes must be valid.

        Raises:
            ValidationError, ValueError: it is not.
        """
        merged = {**self.trainer.config.model_dump(), **self._staged_trainer, **trainer_changes}
        new = TrainerConfig.model_validate(merged)
        check_weighting(self.config.loss_weighting, new.loss_agg)
        if new.kl_coef > 0 and new.lora is None and self.config.trainer.kl_coef == 0:
            raise ValueError("kl_coef > 0 with full fine-tuning needs the server started with kl_coef > 0")
