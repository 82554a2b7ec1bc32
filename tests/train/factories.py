"""Sample factories shared by the trainer tests."""

from __future__ import annotations

import torch

from swarm.tracking.records import Sample

VOCAB = 96
PAD = 0
ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 0.8, 0.8]
"""Advantages aligned with the ``samples`` fixture."""


def make_sample(
    episode_id: str,
    length: int,
    prompt: int,
    *,
    seed: int,
    weight: float = 1.0,
    behaviour: float = -4.5,
) -> Sample:
    """A sample of ``length`` random tokens whose last ``length - prompt`` tokens are scored."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (length,), generator=g).tolist()
    mask = [0] * prompt + [1] * (length - prompt)
    return Sample(
        episode_id=episode_id,
        index=0,
        input_ids=ids,
        loss_mask=mask,
        behaviour_logprobs=[behaviour if m else 0.0 for m in mask],
        call_ids=[0] * length,
        calls=[0],
        weight=weight,
    )
