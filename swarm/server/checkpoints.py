"""Checkpoints in the run dir: Hugging Face-compatible weights plus trainer state, written atomically.

Layout: ``<run_dir>/checkpoints/step-000012/`` holds ``model.safetensors`` + ``config.json`` (full
fine-tuning: loadable with ``AutoModelForCausalLM.from_pretrained``) or ``adapter_model.safetensors`` +
``adapter_config.json`` (LoRA: loadable with ``PeftModel.from_pretrained``), the tokenizer files,
``trainer_state.pt`` (optimizer, step, live config; under verl the optimizer is the folder
``verl_optimizer/``, each rank's shard written by the actor's own workers: `swarm.train.state_files`) and
``meta.json`` (step, time). A checkpoint is written into a temporary folder and renamed into place, so a
crash never leaves a half checkpoint.

:func:`resume` is the restart half of crash safety (docs/ARCHITECTURE.md §Crash safety): the newest
checkpoint is loaded, the pool forgets what later steps consumed, and the metrics rows of those steps
are dropped; :func:`checkpoint_now` is the save half, with its event. A training step checkpoints
through :class:`CheckpointWriter`: a journal entry (``checkpoints/journal/``, the step's batch: a
restart replays it if no checkpoint on disk covers the step), then, unless the previous write is still
running, a CPU `snapshot` and its background write; a step never waits for a write.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarm.pool import Pool
from swarm.server.events import EventLog
from swarm.server.step_batch import StepBatch
from swarm.server.step_history import Drain, StepHistory
from swarm.train import TrainerBackend
from swarm.train.state_files import commit_state_files, discard_staged, resolve_state_files

_NAME = re.compile(r"^step-(\d+)$")


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint ``(step, path)``, or ``None``."""
    root = checkpoint_dir(run_dir)
    found = []
    for path in root.glob("step-*") if root.exists() else []:
        m = _NAME.match(path.name)
        if m and (path / "meta.json").exists():
            found.append((int(m.group(1)), path))
    return max(found) if found else None


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    keep: int,
    weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically and prune all but the newest ``keep`` (and the journal
    entries they cover); returns its path.

    ``weights`` (a `Snapshot`'s) replaces ``model``'s live tensors, so the model may go on training
    while this runs in another thread; ``model`` then only provides its config and file layout.
    State files in ``trainer_state`` (`swarm.train.state_files`: verl's optimizer shards, written by
    its workers) are waited for and moved into the checkpoint before it is marked complete; if the
    checkpoint fails, their staging folders are removed."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:06d}.", dir=root))
    try:
        extra = {} if weights is None else {"state_dict": weights}
        model.save_pretrained(tmp, safe_serialization=True, **extra)
        tokenizer.save_pretrained(tmp)
        torch.save(commit_state_files(trainer_state, tmp), tmp / "trainer_state.pt")
        (tmp / "meta.json").write_text(json.dumps({"step": step, "time": time.time()}))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        discard_staged(trainer_state)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    complete = sorted(
        (int(m.group(1)), p)
        for p in root.glob("step-*")
        if (m := _NAME.match(p.name)) and (p / "meta.json").exists()
    )
    for _, old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for done, entry in _journal(run_dir):
        if done <= step:
            entry.unlink(missing_ok=True)
    return final


def load_weights(path: Path, model: Any) -> None:
    """Load a checkpoint's weights into ``model`` in place (full model or peft adapters)."""
    from safetensors.torch import load_file

    adapter = path / "adapter_model.safetensors"
    if adapter.exists():
        from peft import set_peft_model_state_dict

        load_adapter = getattr(model, "load_adapter_weights", None)
        if load_adapter is not None:  # one named adapter of several (a LoRA tenant's `NamedAdapter`)
            load_adapter(load_file(str(adapter)))
            return
        set_peft_model_state_dict(model, load_file(str(adapter)))
        return
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("model*.safetensors")):
        state.update(load_file(str(shard)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied embeddings are saved once; anything else missing means a wrong checkpoint
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )


def load_trainer_state(path: Path) -> dict[str, Any]:
    """Checkpoint ``path``'s ``trainer_state.pt``, its state-file references (`StateFiles`) resolved to
    their folders in ``path``."""
    state: dict[str, Any] = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    return resolve_state_files(state, path)


def checkpoint_due(step: int, every: int, max_steps: int | None) -> bool:
    """Whether step ``step`` is checkpointed: every ``every``-th step (``checkpoint_every``) and the last
    one of ``max_steps``."""
    return step % every == 0 or (max_steps is not None and step >= max_steps)


def checkpoint_now(
    run_dir: Path,
    trainer: TrainerBackend,
    tokenizer: Any,
    *,
    keep: int,
    events: EventLog,
    replay: bool = False,
) -> float:
    """Save the trainer's current step (`save_checkpoint`) and log ``checkpoint.saved``; returns the
    seconds it took. ``replay``: the step was replayed from the journal at startup (`resume`; the event
    says so with ``replay: true``)."""
    started = time.perf_counter()
    save_checkpoint(run_dir, trainer.step_count, trainer.model, tokenizer, trainer.state_dict(), keep=keep)
    elapsed = time.perf_counter() - started
    replayed: dict[str, Any] = {"replay": True} if replay else {}
    events.emit(
        "checkpoint.saved",
        f"checkpoint step {trainer.step_count} ({elapsed:.1f} s{', after replaying the journal' if replay else ''})",
        step=trainer.step_count,
        write_s=round(elapsed, 3),
        **replayed,
    )
    return elapsed


# -- the background checkpoint: snapshot, journal, writer -------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """A step's state copied to CPU memory: what `CheckpointWriter` writes while training goes on."""

    step: int
    weights: dict[str, torch.Tensor]
    """The model's tensors (LoRA: the adapters' only), by state-dict name, CPU copies."""
    trainer_state: dict[str, Any]
    """`TrainerBackend.state_dict` with every tensor copied to CPU."""


PINNED_SHARE = 0.25
"""The largest share of the host's physical memory a snapshot of CUDA tensors is pinned in (page-locked
memory copies from the GPU several times faster, but the OS cannot swap it); above it the snapshot
goes to pageable memory."""


def snapshot(trainer: TrainerBackend, reuse: Snapshot | None = None) -> Snapshot:
    """Copy the trainer's weights and state to CPU memory (synchronous: a memory copy, no file).

    Shapes and dtypes are the live tensors'; a LoRA model's snapshot holds its ``lora_`` tensors only
    (what its checkpoint stores). ``reuse``: a previous snapshot nobody reads any more (its write
    ended), whose tensors are overwritten where names, shapes and dtypes match (no new allocation).
    CUDA tensors are copied into pinned memory when the snapshot fits `PINNED_SHARE` of the host's
    memory: all copies are queued asynchronously and waited for once (the 1.5B shape's 16.6 GB of
    weights and AdamW state took 1.2–5.5 s into pageable memory on an H100/H200 host)."""
    model = trainer.model
    lora = hasattr(model, "peft_config")
    old = reuse.weights if reuse is not None else {}
    live = {name: t for name, t in model.state_dict().items() if not lora or "lora_" in name}
    state = trainer.state_dict()
    tensors = [*live.values(), *_tensors(state)]
    pin = _pinnable(tensors)
    weights: dict[str, torch.Tensor] = {}
    copies: dict[int, torch.Tensor] = {}  # tied tensors (embeddings and head) are copied once
    for name, tensor in live.items():
        if tensor.data_ptr() not in copies:
            copies[tensor.data_ptr()] = _cpu_copy(tensor, old.get(name), pin=pin)
        weights[name] = copies[tensor.data_ptr()]
    state = _cpu_copy(state, reuse.trainer_state if reuse is not None else None, pin=pin)
    if any(t.is_cuda for t in tensors):
        torch.cuda.synchronize()  # the queued device-to-host copies have landed
    return Snapshot(trainer.step_count, weights, state)


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor inside dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _pinnable(tensors: list[torch.Tensor]) -> bool:
    """Whether a snapshot of ``tensors`` goes to pinned memory: some are CUDA tensors and all together
    take at most `PINNED_SHARE` of the host's physical memory."""
    if not any(t.is_cuda for t in tensors):
        return False
    size = sum(t.numel() * t.element_size() for t in tensors)
    try:
        host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no sysconf: do not pin
        return False
    return size <= PINNED_SHARE * host


def _cpu_copy(value: Any, into: Any = None, *, pin: bool = False) -> Any:
    """``value`` with every tensor inside dicts, lists and tuples copied to CPU: into the matching
    tensor of ``into`` (same structure, shape and dtype) where there is one, else a fresh copy (pinned
    if ``pin`` and the tensor is on CUDA). Copies from CUDA into pinned memory are queued
    (``non_blocking``): the caller synchronises before reading them."""
    if isinstance(value, torch.Tensor):
        source = value.detach()
        if isinstance(into, torch.Tensor) and into.shape == value.shape and into.dtype == value.dtype:
            return into.copy_(source, non_blocking=source.is_cuda and into.is_pinned())
        if pin and source.is_cuda:
            return torch.empty(source.shape, dtype=source.dtype, pin_memory=True).copy_(
                source, non_blocking=True
            )
        return source.to("cpu", copy=True)
    if isinstance(value, dict):
        found = into if isinstance(into, dict) else {}
        return {k: _cpu_copy(v, found.get(k), pin=pin) for k, v in value.items()}
    if isinstance(value, list | tuple):
        same = isinstance(into, list | tuple) and len(into) == len(value)
        return type(value)(_cpu_copy(v, into[i] if same else None, pin=pin) for i, v in enumerate(value))
    return value


class CheckpointWriter:
    """Writes `Snapshot` s with `save_checkpoint` in a background thread, one at a time; a step never
    waits for a write.

    At most one snapshot is in flight. :meth:`checkpoint` journals every step it is called for; while
    the previous write is still running it skips the snapshot (the step is *owed*: its journal entry
    is its only record), and the first later call that finds the writer idle (the next step, or
    :meth:`catch_up` between steps) snapshots the newest state, which covers the owed steps. So
    checkpoints land as often as the disk allows, memory holds at most one snapshot besides the live
    state (each copied into the previous one's buffers: no allocation after the first), and the
    journal holds every step after the newest checkpoint on disk (a restart replays them, `_replay`).
    The thread is not a daemon: a process that exits normally finishes the write first; :meth:`flush`
    also writes an owed newest state. A failed write is logged (``checkpoint.failed``) and leaves the
    previous checkpoint and the journal in place (a restart replays from them).

    Args:
        run_dir: holds ``checkpoints/``.
        model: the trained model (its config and file layout; the tensors come from the snapshot).
        tokenizer: saved with every checkpoint.
        events: ``checkpoint.saved`` / ``checkpoint.failed`` go here.
    """

    def __init__(self, run_dir: Path, model: Any, tokenizer: Any, *, events: EventLog) -> None:
        self.run_dir, self.model, self.events = run_dir, model, events
        self.tokenizer = copy.deepcopy(tokenizer)  # the engine's may be encoding while this one saves
        self._thread: threading.Thread | None = None
        self._spare: Snapshot | None = None
        self._owed: list[int] = []
        """Journaled steps whose snapshot was skipped (a write was in flight), oldest first."""

    @property
    def busy(self) -> bool:
        """A write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def owed(self) -> list[int]:
        """The steps journaled without a snapshot since the last one (a copy; empty: none owed). The
        newest is the trainer's current step: every step after an owed one is journaled too."""
        return list(self._owed)

    def wait(self) -> None:
        """Return once no write is in flight (its checkpoint is on disk, or it failed)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def checkpoint(
        self,
        trainer: TrainerBackend,
        batch: StepBatch,
        *,
        policy: str,
        keep: int,
        max_updates: int | None = None,
    ) -> float:
        """Checkpoint the step ``trainer`` just took on ``batch`` without waiting for a write: journal
        the step (`write_journal`), then, if no write is in flight, take the `snapshot` and start its
        write; else leave the step owed (see the class). ``max_updates``: the updates a step that
        stopped at a non-finite one applied (its replay makes only those). Returns the seconds spent here (the step's
        synchronous cost: journal, plus the snapshot when one was taken; a write's own time is in its
        ``checkpoint.saved`` event)."""
        started = time.perf_counter()
        step = trainer.step_count
        entry = JournalEntry(step, batch, trainer.config.model_dump(), policy, max_updates)
        write_journal(self.run_dir, entry)
        if self.busy:
            self._owed.append(step)
        else:
            self._snapshot_and_write(trainer, keep)
        return time.perf_counter() - started

    def catch_up(self, trainer: TrainerBackend, *, keep: int) -> bool:
        """Between steps: if steps are owed and no write is in flight, snapshot the newest state and
        start its write; returns whether it did. The caller keeps ``trainer`` from stepping meanwhile."""
        if not self._owed or self.busy:
            return False
        self._snapshot_and_write(trainer, keep)
        return True

    def flush(self, trainer: TrainerBackend, *, keep: int) -> None:
        """Make the newest state durable (a stopping server): wait for the write in flight, then write
        an owed state synchronously, from the live tensors. The caller keeps ``trainer`` from stepping."""
        self.wait()
        if self._owed:
            covered, self._owed = self._owed, []
            self._write(trainer.step_count, trainer.state_dict(), None, keep, covered, background=False)

    def _snapshot_and_write(self, trainer: TrainerBackend, keep: int) -> None:
        self.wait()  # (joins a thread that has ended)
        snap = self._spare = snapshot(trainer, self._spare)  # the previous one's buffers: its write ended
        covered, self._owed = self._owed, []
        self.write(snap, keep=keep, skipped=covered)

    def write(self, snap: Snapshot, *, keep: int, skipped: list[int] | None = None) -> None:
        """Start writing ``snap`` in the background (after the previous write ends), then keep the
        newest ``keep`` checkpoints. ``skipped``: earlier steps whose snapshots were skipped, which
        this checkpoint covers (its event's ``skipped``)."""
        self.wait()
        args = (snap.step, snap.trainer_state, snap.weights, keep, skipped or [])
        self._thread = threading.Thread(
            target=self._write, args=args, kwargs={"background": True}, name=f"checkpoint-{snap.step}"
        )
        self._thread.start()

    def _write(
        self,
        step: int,
        trainer_state: dict[str, Any],
        weights: dict[str, torch.Tensor] | None,
        keep: int,
        skipped: list[int],
        *,
        background: bool,
    ) -> None:
        """`save_checkpoint` with its event (``weights`` ``None``: the model's live tensors)."""
        started = time.perf_counter()
        try:
            save_checkpoint(self.run_dir, step, self.model, self.tokenizer, trainer_state, keep, weights)
        except Exception as exc:  # reported; the journal still covers the step
            self.events.emit(
                "checkpoint.failed",
                f"checkpoint step {step} failed: {type(exc).__name__}: {exc}",
                level="error",
                step=step,
            )
            return
        elapsed = time.perf_counter() - started
        where = ", in the background" if background else ""
        covers = f"; covers the skipped snapshots of steps {_span(skipped)}" if skipped else ""
        self.events.emit(
            "checkpoint.saved",
            f"checkpoint step {step} ({elapsed:.1f} s{where}){covers}",
            step=step,
            write_s=round(elapsed, 3),
            skipped=skipped,
        )


@dataclass(frozen=True)
class JournalEntry:
    """What replays a step whose checkpoint was not yet on disk: its batch and the trainer's live config."""

    step: int
    batch: StepBatch
    trainer_config: dict[str, Any]
    """`TrainerConfig` fields as the step used them (live patches included)."""
    policy: str
    """The batch policy's name (the metrics row's ``batch_policy``)."""
    max_updates: int | None = None
    """The updates the step applied when it stopped at a non-finite one (``updates_nonfinite`` > 0): a
    replay makes only those (`TrainerBackend.step`); ``None``: all of them."""


def write_journal(run_dir: Path, entry: JournalEntry) -> None:
    """Record ``entry`` in ``checkpoints/journal/`` atomically (temp file + rename); a few kB to MB (the
    batch's token ids), written before the step is published. `save_checkpoint` deletes the entries
    its checkpoint covers."""
    root = checkpoint_dir(run_dir) / "journal"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{entry.step:06d}.pt"
    tmp = root / f".{final.name}.tmp"
    torch.save(entry, tmp)
    os.replace(tmp, final)


def _journal(run_dir: Path) -> list[tuple[int, Path]]:
    root = checkpoint_dir(run_dir) / "journal"
    found = [(int(m.group(1)), p) for p in root.glob("step-*.pt") if (m := _NAME.match(p.stem))]
    return sorted(found)


def _replay(run_dir: Path, step: int, trainer: TrainerBackend, pool: Pool, history: StepHistory) -> list[int]:
    """Redo the journaled steps after checkpoint ``step`` (contiguous from ``step + 1``) with their
    batches and live config: the trainer reaches the step the previous process published, the
    episodes stay marked by it, and a metrics row the crash cut off is written. Returns the steps."""
    entries: list[JournalEntry] = []
    for number, path in _journal(run_dir):
        if number == step + len(entries) + 1:
            entries.append(torch.load(path, map_location="cpu", weights_only=False))
    if not entries:
        return []
    history.resume(entries[-1].step)
    have = {row.step for row in history.rows}
    for entry in entries:
        live = {k: v for k, v in entry.trainer_config.items() if k in trainer.live_fields}
        trainer.update_config(**live)
        base = trainer.step(
            entry.batch.samples,
            entry.batch.advantages,
            rewards=entry.batch.rewards,
            max_updates=entry.max_updates,
        )
        if entry.max_updates is not None and not base.updates_nonfinite:  # the row of the original step
            base = base.model_copy(update={"updates_nonfinite": 1})
        pool.mark_trained(entry.batch.consumed, entry.step)
        if entry.step not in have:
            history.record(base, entry.batch, policy=entry.policy, drain=Drain(), checkpoint_s=0.0)
    trainer.sync_sampling_model()
    return [entry.step for entry in entries]


def resume(
    run_dir: Path,
    trainer: TrainerBackend,
    pool: Pool,
    history: StepHistory,
    events: EventLog,
    *,
    tokenizer: Any,
    keep: int,
) -> int:
    """Restart where the previous process left the run; returns that step (0: none, a fresh run).

    Loads the newest checkpoint into ``trainer`` (weights, sampling copy, optimizer and live config),
    then replays the journaled steps after it (`write_journal`: steps published while their checkpoint
    was being written) and checkpoints the result, so a published step is never lost. Episodes consumed
    by any later, unjournaled step are un-marked (`Pool.rewind`: their update died with the process,
    so they are trained again), the later rows of ``history`` are dropped and ``history.rewound_steps``
    holds those steps, each with its event. Half-written checkpoint folders are removed.
    """
    for stale in checkpoint_dir(run_dir).glob(".step-*"):
        shutil.rmtree(stale, ignore_errors=True)
    latest = latest_checkpoint(run_dir)
    step = 0
    if latest is not None:
        step, path = latest
        started = time.perf_counter()
        load_weights(path, trainer.model)
        trainer.sync_sampling_model()
        trainer.load_state_dict(load_trainer_state(path))
        load_s = time.perf_counter() - started
        events.emit(
            "checkpoint.loaded",
            f"resumed from checkpoint step {step} ({load_s:.1f} s)",
            step=step,
            load_s=round(load_s, 3),
        )
    replayed = _replay(run_dir, step, trainer, pool, history)
    if replayed:
        step = replayed[-1]
        # (the trainer is at that step: each replayed step counted one) the checkpoint prunes their entries
        checkpoint_now(run_dir, trainer, tokenizer, keep=keep, events=events, replay=True)
        events.emit(
            "checkpoint.replayed",
            f"step {_span(replayed)} replayed from the journal (its checkpoint was being written)",
            steps=replayed,
        )
    for _, entry in _journal(run_dir):  # beyond a gap: their steps are rewound below, never replayed
        entry.unlink()
    lost = set(pool.trained_steps_after(step))
    rewound = pool.rewind(step)
    if rewound:
        events.emit(
            "pool.rewound",
            f"{rewound} episodes consumed after step {step} will be trained again (their update was lost)",
            level="warning",
            episodes=rewound,
        )
    history.rewound_steps = sorted(lost | history.resume(step))
    if history.rewound_steps:
        events.emit(
            "train.rewound",
            f"steps {_span(history.rewound_steps)} were lost with the previous process (last checkpoint: "
            f"step {step}); the next update is step {step + 1} again",
            level="warning",
            rewound_steps=history.rewound_steps,
            resumed_from=step,
        )
    return step


def _span(steps: list[int]) -> str:
    """``6-8`` for consecutive steps, else ``6, 8``."""
    if steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 1:
        return f"{steps[0]}-{steps[-1]}"
    return ", ".join(str(s) for s in steps)
