"""How a run's metric values read on a screen: which come first, and at what precision.

Shared by ``a3r runs`` (`a3r.app.cli`) and the TUI's run tables (`a3r.app.tui`), so both list the same
metrics first and print ``reward_mean=0`` rather than ``1.388e-17``.
"""

from __future__ import annotations

__all__ = ["KEY_METRICS", "NOISE_FLOOR", "number_text"]

KEY_METRICS = (
    "reward_mean",
    "eval/mean_reward",
    "eval/pass_at_1",
    "eval/pass_at_2",
    "episodes/mean_reward",
    "loss",
    "kl",
    "entropy",
    "grad_norm",
    "clip_frac",
    "tis_weight_mean",
    "staleness_mean",
    "steps",
    "wall_s",
)
"""The metrics a run listing shows first, in this order; then any other reward or eval metric (all of them
are in ``a3r export``)."""


NOISE_FLOOR = 1e-9
"""Values smaller than this in magnitude print as 0: a mean reward of ``1.388e-17`` is float rounding of
zero, not a measurement."""


def number_text(value: float) -> str:
    """A metric value at a readable precision: whole numbers without a point (``12``), float noise as
    ``0``, everything else with four significant digits (``0.6667``, ``1.5e-05``)."""
    if abs(value) < NOISE_FLOOR:
        return "0"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"
