"""Staging for the background optimizer writes of verl's actor ranks (`swarm.train.verl_backend`).

``torch.distributed.checkpoint.async_save`` first *stages* a rank's state dict (copies it into CPU memory;
the call returns then) and writes it in a thread. A ``DefaultStager`` keeps its CPU buffers between calls,
so every snapshot after the first copies into memory it already holds, pinned on a GPU host (a fast
device-to-host copy, no allocation on the step's path).

torch 2.11.0's ``DefaultStager._stage`` closes its inner ``StateDictStager`` after every stage, which
empties its deepcopy dispatch table: the second stage of the same stager raises ``KeyError: <class
'type'>`` (pytorch/pytorch#183413, a regression of #170431, fixed by #183424). An H100 run of verl's
resume check failed so at its second checkpoint. :func:`stager_reusable` probes for it; where it finds it,
:class:`OptimizerStagers` gives every snapshot a fresh stager with pageable buffers (pinning a fresh
16 GB buffer each time costs more than the faster copy saves).
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

__all__ = ["OptimizerStagers", "stager_reusable"]


def _stager(*, pinned: bool) -> DefaultStager:
    """A synchronous stager (the copy happens in the ``async_save`` call, before the next optimizer
    step can change the state), into pinned buffers if ``pinned``."""
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=pinned,
            use_shared_memory=False,
            use_async_staging=False,
            use_non_blocking_copy=False,
        )
    )


def stager_reusable() -> bool:
    """Whether one ``DefaultStager`` can stage twice in this torch (False on 2.11.0: pytorch#183413). A
    probe on a tiny CPU state dict shaped like an optimizer's (a few microseconds)."""
    probe = _stager(pinned=False)
    state = {"state": {0: {"step": torch.zeros(()), "exp_avg": torch.ones(2)}}, "param_groups": [{"lr": 1.0}]}
    try:
        probe.stage(state)
        probe.stage(state)
    except KeyError:
        return False
    finally:
        with contextlib.suppress(Exception):
            probe.close()
    return True


class OptimizerStagers:
    """The stager for each optimizer snapshot of one actor rank: one kept for every snapshot where torch
    allows it (its buffers reused; pinned if ``pinned``), else a fresh pageable one each time.

    Args:
        pinned: pin the kept stager's CPU buffers (on a CUDA host).
        reusable: whether one stager may stage twice; default: probed (:func:`stager_reusable`).
    """

    def __init__(self, *, pinned: bool, reusable: bool | None = None) -> None:
        self.pinned = pinned
        self.reusable = stager_reusable() if reusable is None else reusable
        self._kept: DefaultStager | None = None

    def next(self) -> DefaultStager:
        """The stager for the next snapshot."""
        if not self.reusable:
            return _stager(pinned=False)
        if self._kept is None:
            self._kept = _stager(pinned=self.pinned)
        return self._kept

    def close(self) -> None:
        """Free the kept stager's buffers (it is made again on the next :meth:`next`)."""
        if self._kept is not None:
            self._kept.close()
            self._kept = None
