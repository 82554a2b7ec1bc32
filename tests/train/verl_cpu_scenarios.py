"""The scenarios `tests.train.verl_cpu` runs in its subprocess (verl's FSDP actor on the CPU).

Each takes a scratch folder and returns a JSON-able dict of measurements; the assertions are in
tests/train/test_verl_cpu.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from swarm.train import LoraSettings, TrainerConfig
from swarm.train.verl_backend import VerlTrainer
from tests.train.factories import PAD, make_sample
from tests.train.verl_cpu import cpu_worker_group, save_tiny_model

BATCHES = [
    (
        [make_sample("a0", 12, 5, seed=0), make_sample("a1", 9, 3, seed=1), make_sample("a2", 14, 4, seed=2)],
        [1.0, -1.0, 0.5],
    ),
    (
        [make_sample("b0", 10, 4, seed=3), make_sample("b1", 13, 6, seed=4), make_sample("b2", 8, 2, seed=5)],
        [-0.5, 1.0, -0.8],
    ),
]
"""Two steps' samples and advantages."""


def _served(base: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base).eval()


def _trainer(base: Path, model_path: Path, config: TrainerConfig, start: bool) -> VerlTrainer:
    torch.manual_seed(7)  # the served copy's LoRA initialisation (the actor takes it from there)
    return VerlTrainer(_served(base), model_path, config, PAD, start=start, worker_group=cpu_worker_group)


def _weights(trainer: VerlTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _norm(tensors: dict[str, torch.Tensor]) -> float:
    """The L2 norm of all of ``tensors`` together (one flat vector)."""
    return float(torch.sqrt(sum((t.double() ** 2).sum() for t in tensors.values())))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def resume(folder: Path, *, lora: bool = False) -> dict[str, Any]:
    """Uninterrupted two steps vs one step, a checkpoint, a new actor from it, the second step; once
    with the checkpoint's optimizer state, once without it (a fresh AdamW)."""
    from transformers import AutoTokenizer

    from swarm.server.checkpoints import load_trainer_state, load_weights, save_checkpoint

    base = folder / "base"
    save_tiny_model(base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    config = TrainerConfig(lr=1e-3, lora=LoraSettings(r=4, alpha=8) if lora else None)

    straight = _trainer(base, base, config, start=True)
    before = _weights(straight)
    straight.step(*BATCHES[0])
    after_first = _weights(straight)
    straight.step(*BATCHES[1])
    uninterrupted = _weights(straight)

    interrupted = _trainer(base, base, config, start=True)
    interrupted.step(*BATCHES[0])
    interrupted.state_dir = folder / "run" / "checkpoints"  # as the server's (`make_trainer`)
    state = interrupted.state_dict()
    path = save_checkpoint(folder / "run", 1, interrupted.model, tokenizer, state, keep=2)
    out: dict[str, Any] = {
        "first_step_vs_uninterrupted": _max_diff(_weights(interrupted), after_first),
        "first_update": _max_diff(after_first, before),
        "second_update": _max_diff(uninterrupted, after_first),
        "optimizer_saved": "verl_optimizer" in load_trainer_state(path),
        "checkpoint_files": sorted(p.name for p in path.iterdir()),
        **_optimizer_files(state, path, base, config),
    }
    # started at construction as on a GPU (the state is loaded into running workers), or on the first
    # step (the state waits for them); and once without the optimizer state
    for name, keep_optimizer, start in (
        ("resumed", True, True),
        ("resumed_lazy", True, False),
        ("fresh_optimizer", False, True),
    ):
        # the actor loads what make_trainer gives it: the checkpoint's folder, or with LoRA the base model
        resumed = _trainer(base, base if lora else path, config, start=start)
        load_weights(path, resumed.model)
        resumed.sync_sampling_model()
        saved = load_trainer_state(path)
        if not keep_optimizer:
            saved.pop("verl_optimizer")
        resumed.load_state_dict(saved)
        resumed.step(*BATCHES[1])
        out[f"{name}_vs_uninterrupted"] = _max_diff(_weights(resumed), uninterrupted)
        out[f"{name}_step"] = resumed.step_count
        if lora and name == "resumed":
            out.update(_lora_checks(resumed))
    return out


def _tensors(value: Any) -> int:
    """Tensors inside dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, dict):
        return sum(_tensors(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensors(v) for v in value)
    return 0


def _optimizer_files(state: dict[str, Any], path: Path, base: Path, config: TrainerConfig) -> dict[str, Any]:
    """What the trainer's state dict and the checkpoint hold of the optimizer, and what a resume from a
    copy of the checkpoint whose optimizer folder is incomplete, or missing, says."""
    import shutil

    from swarm.server.checkpoints import load_trainer_state
    from swarm.train import TrainerError
    from swarm.train.state_files import StateFiles

    stored = load_trainer_state(path)
    out: dict[str, Any] = {
        "state_dict_optimizer": type(state["verl_optimizer"]).__name__,
        "state_dict_tensors": _tensors(state),
        "stored_optimizer": type(stored["verl_optimizer"]).__name__,
        "stored_lr_scheduler": sorted(stored["verl_lr_scheduler"]),
        "trainer_state_bytes": (path / "trainer_state.pt").stat().st_size,
        "optimizer_folder_bytes": sum(f.stat().st_size for f in (path / "verl_optimizer").iterdir()),
        "staging_left": sorted(p.name for p in path.parent.glob(".step-*")),
    }
    assert isinstance(stored["verl_optimizer"], StateFiles)
    for damage in ("incomplete", "missing"):
        copy = path.parent / f"damaged-{damage}"
        shutil.copytree(path, copy)
        if damage == "incomplete":
            (copy / "verl_optimizer" / ".metadata").unlink()
        else:
            shutil.rmtree(copy / "verl_optimizer")
        trainer = _trainer(base, copy, config, start=False)
        try:
            trainer.load_state_dict(load_trainer_state(copy))
            out[f"refused_{damage}"] = None
        except TrainerError as exc:
            out[f"refused_{damage}"] = str(exc)
        shutil.rmtree(copy)
    return out


def _lora_checks(trainer: VerlTrainer) -> dict[str, Any]:
    """The served copy holds the actor's adapters, they were trained, and the merged sampling copy
    computes what the adapters do."""
    actor = trainer._workers().adapter_state_dict()[0]
    served = {k: v for k, v in trainer.model.state_dict().items() if "lora_" in k}
    ids = torch.tensor([BATCHES[0][0][0].input_ids])
    with torch.no_grad():
        merged = trainer.sampling_model(ids).logits
        adapters = trainer.model(ids).logits
    return {
        "adapter_names_match": sorted(actor) == sorted(served),
        "actor_vs_served_adapters": _max_diff(actor, served),
        "lora_B_max": max(float(v.abs().max()) for k, v in served.items() if "lora_B" in k),
        "sampler_is_merged_copy": trainer.sampling_model is not trainer.model,
        "merged_vs_adapter_logits": float((merged - adapters).abs().max()),
        "trainable_in_actor": sum(
            p.numel() for p in trainer._workers().worker.actor.engine.module.parameters() if p.requires_grad
        ),
        "adapter_numel": sum(v.numel() for v in served.values()),
    }


def asynchronous(folder: Path) -> dict[str, Any]:
    """A live server, ``--trainer verl --max-staleness 1`` (TASKS, B = 1, G = 2): an episode open across
    a step keeps running and is aborted as too stale by the next; group ``b``, sampled by policy 0 and
    finished after step 1, is trained by step 2 (staleness 1) with its own behaviour logprobs; the engine
    serves the actor's weights."""
    import httpx
    from transformers import AutoTokenizer

    import swarm.train.verl_backend as backend
    from swarm.batch import BatchConfig, BatchPolicy
    from swarm.client import SwarmClient
    from swarm.config import TrainingConfig
    from swarm.engine import HFEngine
    from tests.conftest import make_server, wait_for
    from tests.server.test_training import _call, rollout

    base = folder / "base"
    save_tiny_model(base)
    backend.ray_worker_group = lambda settings, node, role: cpu_worker_group(node, role)  # no Ray here
    training = TrainingConfig(
        backend="verl",
        max_staleness=1,
        batch=BatchConfig(policy=BatchPolicy.TASKS, batch_size=1, group_size=2),
        trainer=TrainerConfig(lr=1e-2, tis_cap=2.0),
    )
    engine = HFEngine(_served(base), AutoTokenizer.from_pretrained(base), "tiny-verl")
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    live = make_server(folder, engine, training=training, model=str(base))
    try:
        with SwarmClient(live.url) as client:
            straggler = client.begin("slow")
            _call(straggler)  # sampled by policy 0, stays open
            late = [client.begin("b"), client.begin("b")]
            for episode in late:
                _call(episode)  # sampled by policy 0, finished after step 1
            for reward in (1.0, 0.0):
                rollout(client, "a", reward)
            wait_for(lambda: client.status().step == 1, 300, "step 1")
            views = [client.get_episode(straggler.id)]
            for episode, reward in zip(late, (1.0, 0.0), strict=True):
                episode.finish(reward)
            wait_for(lambda: client.status().step == 2, 300, "step 2")
            views.append(client.get_episode(straggler.id))
        metrics = httpx.get(f"{live.url}/api/v1/metrics").json()
        trainer = live.runtime.training.trainer
        actor = trainer._workers().full_state_dict()[0]
        served = engine.model.state_dict()
        return {
            "open_after_step_1": views[0].status,
            "straggler": [views[1].status, views[1].reason or ""],
            "drain_s": [m["drain_s"] for m in metrics],
            "stale_aborted": [m["stale_aborted"] for m in metrics],
            "tis_weight_mean": [m["tis_weight_mean"] for m in metrics],
            "staleness_mean": [m["staleness_mean"] for m in metrics],
            "drift_mean": [m["logprob_drift_mean"] for m in metrics],
            "recomputed_old_logprobs": [m["time_s"]["old_logprobs_s"] > 0 for m in metrics],
            "served_vs_actor": max(float((served[k] - v).abs().max()) for k, v in actor.items()),
            "served_changed": _max_diff(dict(served), before),
        }
    finally:
        live.stop()
        engine.close()


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "resume": resume,
    "resume-lora": lambda folder: resume(folder, lora=True),
    "async": asynchronous,
}


class BucketReceiver:
    """The receiving end of the direct weight path on the CPU: `receive_buckets` (the code vLLM's worker
    runs) into a Hugging Face module, the buffers handed over as they are (``bucket_transport``) where
    vLLM maps CUDA IPC handles. ``corrupt``/``delay_s`` make it fail the ways a real transfer can."""

    bucket_transport = "tensor"

    def __init__(self, module: Any, *, corrupt: bool = False, delay_s: float = 0.0) -> None:
        self.module, self.corrupt, self.delay_s = module, corrupt, delay_s
        self.policy_version = 0

    def load_weight_buckets(
        self, items: list[tuple[Any, Any]], policy_version: int
    ) -> list[tuple[float, float]]:
        import time

        from swarm.train.weight_buckets import receive_buckets

        time.sleep(self.delay_s)
        own = self.module.state_dict()

        def rebuild(flat: Any) -> torch.Tensor:
            received = flat.clone()
            if self.corrupt:
                received[-1] += 1.0
            return received

        def load(views: list[tuple[str, torch.Tensor]]) -> None:
            for name, view in views:
                own[name].copy_(view)

        prints = receive_buckets(items, rebuild, load)
        self.policy_version = policy_version
        return prints


def direct(folder: Path) -> dict[str, Any]:
    """``weight_sync="direct"``: after a step the actor's weights reach the receiver in buckets, checked by
    fingerprint; the server's copy is gathered only when read; a corrupted or hung transfer fails loudly."""
    from swarm.train import VerlSettings
    from swarm.train.weight_buckets import WeightSyncError

    base = folder / "base"
    save_tiny_model(base)
    settings = VerlSettings(weight_sync="direct", bucket_mb=1, weight_sync_timeout_s=3.0)
    trainer = VerlTrainer(
        _served(base), base, TrainerConfig(lr=1e-2), PAD, settings=settings, start=True,
        worker_group=cpu_worker_group,
    )  # fmt: skip
    before = {k: v.clone() for k, v in trainer._module.state_dict().items()}
    receiver = BucketReceiver(_served(base))
    trainer.step(*BATCHES[0])
    copy_unchanged = _max_diff({k: v.clone() for k, v in trainer._module.state_dict().items()}, before)
    pushed = trainer.push_weights(receiver, 1)
    actor = trainer._workers().full_state_dict()[0]
    received = receiver.module.state_dict()
    out: dict[str, Any] = {
        "pushed": pushed,
        "receiver_version": receiver.policy_version,
        "receiver_vs_actor": max(float((received[k] - v).abs().max()) for k, v in actor.items()),
        "receiver_changed": _max_diff(dict(received), before),
        "copy_unchanged_after_step": copy_unchanged,
        "last_push": trainer.last_push,
        "copy_vs_actor_when_read": max(
            float((trainer.model.state_dict()[k] - v).abs().max()) for k, v in actor.items()
        ),
    }
    for name, bad in (
        ("corrupt", BucketReceiver(_served(base), corrupt=True)),
        ("hung", BucketReceiver(_served(base), delay_s=30)),
    ):
        try:
            trainer.push_weights(bad, 2)
            out[name] = "no error"
        except WeightSyncError as exc:
            out[name] = str(exc)
    return out


SCENARIOS["direct"] = direct


def broadcast(folder: Path) -> dict[str, Any]:
    """``weight_sync="direct"`` with vLLM's worker code in a second process (not on the actor's GPU): the
    broadcast group is chosen and formed at the first push (gloo here, NCCL on GPUs); after each of two
    steps the actor's weights reach the worker through it, checked by fingerprint; a corrupted transfer
    and a silent worker fail loudly within the timeout, and after a failed group no push is tried."""
    import time

    from swarm.train import VerlSettings
    from swarm.train.backend import TrainerError
    from swarm.train.weight_buckets import WeightSyncError
    from tests.train.weight_receiver_process import ProcessEngine

    base = folder / "base"
    save_tiny_model(base)
    settings = VerlSettings(weight_sync="direct", bucket_mb=1, weight_sync_timeout_s=5.0)
    trainer = VerlTrainer(
        _served(base), base, TrainerConfig(lr=1e-2), PAD, settings=settings, start=True,
        worker_group=cpu_worker_group,
    )  # fmt: skip
    out: dict[str, Any] = {}
    engine = ProcessEngine()
    try:
        for version, batch in enumerate(BATCHES, start=1):
            trainer.step(*batch)
            out[f"pushed_{version}"] = trainer.push_weights(engine, version)
            actor = trainer._workers().full_state_dict()[0]
            received = engine.weights()
            out[f"names_match_{version}"] = sorted(received) == sorted(actor)
            out[f"received_vs_actor_{version}"] = max(
                float((received[k] - v).abs().max()) for k, v in actor.items()
            )
        out["engine_version"] = engine.policy_version
        out["last_push"] = trainer.last_push
    finally:
        engine.close()
    for mode in ("corrupt", "silent"):
        bad = ProcessEngine(mode)  # another engine: a new group, with a worker that fails
        started = time.monotonic()
        try:
            trainer.push_weights(bad, 3)
            out[mode] = "no error"
        except WeightSyncError as exc:
            out[mode] = str(exc)
        finally:
            out[f"{mode}_s"] = time.monotonic() - started
            bad.close()
    try:
        trainer.push_weights(engine, 4)
        out["after_failure"] = "no error"
    except WeightSyncError as exc:
        out["after_failure"] = str(exc)
    trainer.settings = settings.model_copy(update={"weight_sync": "ipc"})  # forced, vLLM elsewhere
    trainer._group_failed = None  # as after a restart
    elsewhere = ProcessEngine()
    try:
        trainer.push_weights(elsewhere, 5)
        out["forced_ipc"] = "no error"
    except TrainerError as exc:
        out["forced_ipc"] = str(exc)
    finally:
        elsewhere.close()
    return out


SCENARIOS["broadcast"] = broadcast


def _counted(trainer: VerlTrainer) -> list[int]:
    """Count the worker's ``compute_log_prob`` calls (the π_θ_old recompute) from here on."""
    worker = trainer._workers().worker
    calls = [0]
    recompute = worker.compute_log_prob

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return recompute(*args, **kwargs)

    worker.compute_log_prob = counted
    return calls


def on_policy(folder: Path) -> dict[str, Any]:
    """One step on the same batch and weights (tis_cap 2, entropy bonus 0, micro-batches of 2: verl's
    gradients accumulate over two passes, one with a padding row): verl on-policy (π_θ_old from
    the update's own forward), verl with the recompute forced, verl with two minibatches (off-policy: the
    recompute kept), and the torch trainer. Reports the recompute calls, each step's statistics and the
    weights' distance to the torch trainer's and to the forced recompute's."""
    from swarm.train import TorchTrainer

    base = folder / "base"
    save_tiny_model(base)
    samples, advantages = BATCHES[0]
    # μ near the random model's logprobs (about −10.8), every other token far enough that the TIS cap acts
    behaved = [
        s.model_copy(
            update={
                "behaviour_logprobs": [(-11.8 if t % 2 else -10.5) * m for t, m in enumerate(s.loss_mask)]
            }
        )
        for s in samples
    ]
    fields = ("loss", "policy_loss", "grad_norm", "entropy", "logprob_drift_mean", "logprob_drift_max",
              "tis_weight_mean", "ratio_mean", "clip_frac")  # fmt: skip
    out: dict[str, Any] = {}
    weights: dict[str, dict[str, torch.Tensor]] = {}
    for name, config in (
        ("on_policy", TrainerConfig(lr=1e-3, tis_cap=2.0, micro_batch_size=2)),
        ("recompute", TrainerConfig(lr=1e-3, tis_cap=2.0, micro_batch_size=2, recompute_old_logprobs=True)),
        ("minibatches", TrainerConfig(lr=1e-3, tis_cap=2.0, micro_batch_size=2, minibatches=3)),
    ):
        trainer = _trainer(base, base, config, start=True)
        calls = _counted(trainer)
        metrics = trainer.step(behaved, advantages)
        out[name] = {f: getattr(metrics, f) for f in fields}
        out[name]["compute_log_prob_calls"] = calls[0]
        out[name]["old_logprobs_s"] = metrics.time_s.old_logprobs_s
        weights[name] = _weights(trainer)
    torch_trainer = TorchTrainer(_served(base), TrainerConfig(lr=1e-3, tis_cap=2.0, micro_batch_size=2), PAD)
    metrics = torch_trainer.step(behaved, advantages)
    out["torch"] = {f: getattr(metrics, f) for f in fields}
    weights["torch"] = {k: v.detach().clone() for k, v in torch_trainer.model.state_dict().items()}
    out["on_policy_vs_recompute"] = _max_diff(weights["on_policy"], weights["recompute"])
    out["on_policy_vs_torch"] = _max_diff(weights["on_policy"], weights["torch"])
    return out


SCENARIOS["on-policy"] = on_policy


def _behaviour(model: Any, sample: Any) -> list[float]:
    """``sample``'s trained tokens' logprobs under ``model`` (float32, temperature 1): what an engine
    serving ``model`` records as the behaviour logprobs μ (0 on untrained positions)."""
    ids = torch.tensor([sample.input_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)  # (T-1, V)
    scored = logprobs.gather(-1, ids[0, 1:, None])[:, 0].tolist()  # position t+1's token given [:t+1]
    return [0.0] + [lp if m else 0.0 for lp, m in zip(scored, sample.loss_mask[1:], strict=True)]


def stale(folder: Path) -> dict[str, Any]:
    """An asynchronous step's batch through verl's real actor and through the torch trainer.

    Step 1 trains on-policy (μ = policy 0's logprobs). Step 2's batch mixes two episodes sampled by
    policy 0 (stale by one version, as ``--max-staleness 1`` lets them be trained) with one sampled by
    policy 1 (the weights after step 1): each keeps its own μ. π_θ_old of step 2 is policy 1 (the weights
    that start the step, whatever sampled the tokens); the stale tokens' μ ≠ π_θ_old enters only the
    truncated importance weights ``min(π_θ_old/μ, 2)``. Runs: verl on-policy (π_θ_old from the update's
    own forward, :func:`on_policy_ppo_loss`), verl with the recompute forced, the torch trainer, and a
    wrong variant for contrast (verl with μ taken as π_θ_old: the clip then acts on μ's ratio and the
    TIS correction is lost). Reports step 2's statistics and the weights' distances after step 2."""
    from swarm.train import TorchTrainer

    base = folder / "base"
    save_tiny_model(base)
    policy0 = _served(base)
    first = [s.model_copy(update={"behaviour_logprobs": _behaviour(policy0, s)}) for s in BATCHES[0][0]]
    fields = ("loss", "policy_loss", "grad_norm", "entropy", "logprob_drift_mean", "logprob_drift_max",
              "tis_weight_mean", "ratio_mean", "clip_frac")  # fmt: skip
    # lr 1e-2 and a clip range of ±0.05: step 1 moves the policy far enough that μ-as-π_θ_old ratios of
    # stale tokens leave the clip range (within it, π/μ as the ratio and as the TIS weight give the same
    # gradient, so the wrong variant would not show)
    config = TrainerConfig(lr=1e-2, tis_cap=2.0, micro_batch_size=2, clip_eps_low=0.05, clip_eps_high=0.05)
    torch_trainer = TorchTrainer(_served(base), config, PAD)
    torch_trainer.step(first, BATCHES[0][1])
    policy1 = torch_trainer.model
    samples, advantages = BATCHES[1]
    second = [  # b0, b1 stale (policy 0's μ), b2 fresh (policy 1's μ)
        s.model_copy(update={"behaviour_logprobs": _behaviour(policy0 if i < 2 else policy1, s)})
        for i, s in enumerate(samples)
    ]
    drift = {
        name: max(
            abs(a - b)
            for s in group
            for a, b, m in zip(s.behaviour_logprobs, _behaviour(policy1, s), s.loss_mask, strict=True)
            if m
        )
        for name, group in (("stale", second[:2]), ("fresh", second[2:]))
    }
    out: dict[str, Any] = {"stale_drift_max": drift["stale"], "fresh_drift_max": drift["fresh"]}
    start = {k: v.detach().clone() for k, v in torch_trainer.model.state_dict().items()}  # policy 1
    metrics = torch_trainer.step(second, advantages)
    out["torch"] = {f: getattr(metrics, f) for f in fields}
    weights = {"torch": {k: v.detach().clone() for k, v in torch_trainer.model.state_dict().items()}}
    for name, run_config in (
        ("on_policy", config),
        ("recompute", config.model_copy(update={"recompute_old_logprobs": True})),
        ("mu_as_old", config),
    ):
        trainer = _trainer(base, base, run_config, start=True)
        trainer.step(first, BATCHES[0][1])
        calls = _counted(trainer)
        if name == "mu_as_old":  # no recompute and the shortcut off: verl's loss reads μ as π_θ_old
            update = trainer._update_actor

            def wrong(*args: Any, update: Any = update, **kwargs: Any) -> Any:
                return update(*args, **{**kwargs, "on_policy": False})

            trainer._update_actor = wrong  # type: ignore[method-assign]
        metrics = trainer.step(second, advantages)
        out[name] = {f: getattr(metrics, f) for f in fields}
        out[name]["compute_log_prob_calls"] = calls[0]
        weights[name] = _weights(trainer)
    update = _norm({k: weights["torch"][k].float() - start[k].float() for k in start})
    for name in ("on_policy", "recompute", "mu_as_old"):
        out[f"{name}_vs_torch"] = _max_diff(weights[name], weights["torch"])
        gap = _norm({k: weights[name][k].float() - weights["torch"][k].float() for k in start})
        out[f"{name}_vs_torch_relative"] = gap / update
    out["on_policy_vs_recompute"] = _max_diff(weights["on_policy"], weights["recompute"])
    return out


SCENARIOS["stale"] = stale


def nonfinite(folder: Path) -> dict[str, Any]:
    """Three minibatches of one sample each; the second's advantage 1e38 (finite: the batch is accepted)
    overflows its gradient. verl's engine skips that update and makes the third: the step counts with two
    updates applied. With every advantage 1e38 nothing is applied and the trainer raises, its weights and
    step count unchanged."""
    from swarm.train import TrainerError

    base = folder / "base"
    save_tiny_model(base)
    samples, advantages = BATCHES[0]
    config = TrainerConfig(lr=1e-3, micro_batch_size=1, minibatches=3)
    out: dict[str, Any] = {}
    trainer = _trainer(base, base, config, start=True)
    before = _weights(trainer)
    metrics = trainer.step(samples, [advantages[0], 1e38, advantages[2]])
    out["partial"] = {
        "step": metrics.step,
        "step_count": trainer.step_count,
        "updates": metrics.updates,
        "updates_nonfinite": metrics.updates_nonfinite,
        "grad_norm": metrics.grad_norm,
        "loss": metrics.loss,
        "policy_loss": metrics.policy_loss,
        "clip_frac": metrics.clip_frac,
        "moved": _max_diff(_weights(trainer), before),
    }
    trainer = _trainer(base, base, config, start=True)
    try:
        trainer.step(samples, [1e38] * len(samples))
        out["all"] = {"raised": None}
    except TrainerError as exc:
        out["all"] = {"raised": str(exc), "step_count": trainer.step_count}
    trainer.sync_sampling_model()
    out["all"]["moved"] = _max_diff(_weights(trainer), before)
    return out


SCENARIOS["nonfinite"] = nonfinite


def snapshots(folder: Path) -> dict[str, Any]:
    """Two steps with a checkpoint after each, by one actor, twice: with this torch's stager, and with
    torch 2.11.0's (``DefaultStager._stage`` closes its inner stager after every stage, so staging twice
    raises ``KeyError: <class 'type'>``: pytorch#183413, met on an H100 at the second checkpoint). Each
    checkpoint's optimizer folder must hold that step's AdamW state (its step count, moments that moved)."""
    from torch.distributed.checkpoint.staging import DefaultStager
    from transformers import AutoTokenizer

    from swarm.server.checkpoints import save_checkpoint
    from swarm.train.dcp_staging import stager_reusable
    from swarm.train.verl_backend import read_optimizer_files

    base = folder / "base"
    save_tiny_model(base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    config = TrainerConfig(lr=1e-3)
    stage = DefaultStager._stage

    def stage_as_torch_2_11(self: Any, state_dict: Any, **kwargs: Any) -> Any:
        staged = stage(self, state_dict, **kwargs)
        self._state_dict_stager.close()
        return staged

    out: dict[str, Any] = {}
    for mode in ("this torch", "torch 2.11"):
        if mode == "torch 2.11":
            DefaultStager._stage = stage_as_torch_2_11  # type: ignore[method-assign]
        run = folder / mode.replace(" ", "-")
        trainer = _trainer(base, base, config, start=True)
        trainer.state_dir = run / "checkpoints"
        moments = []
        for step, (samples, advantages) in enumerate(BATCHES, start=1):
            trainer.step(samples, advantages)
            path = save_checkpoint(run, step, trainer.model, tokenizer, trainer.state_dict(), keep=2)
            optimizer = read_optimizer_files(path / "verl_optimizer")
            moments.append({k: v["exp_avg"].clone() for k, v in optimizer["state"].items()})
            out[f"{mode}: step {step} count"] = sorted(
                {float(v["step"]) for v in optimizer["state"].values()}
            )
        out[f"{mode}: moments moved"] = max(
            float((moments[1][k] - moments[0][k]).abs().max()) for k in moments[0]
        )
        out[f"{mode}: reusable"] = stager_reusable()
        out[f"{mode}: stagers kept"] = trainer._workers().worker._stagers.reusable
    DefaultStager._stage = stage  # type: ignore[method-assign]
    return out


SCENARIOS["snapshots"] = snapshots
