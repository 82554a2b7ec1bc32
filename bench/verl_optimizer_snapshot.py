"""verl's optimizer snapshot on a checkpoint's step path, before and after issue 37's change, on the CPU.

verl's real FSDP actor runs on the CPU in this process (the harness of tests/train/verl_cpu.py: verl's
own worker, engine and AdamW; one gloo rank; Ray's dispatch replaced by a direct call). After one step
(AdamW has its moments), each round measures:

- **before** (the old path, still available as the worker's ``optimizer_state``): the full unsharded
  AdamW state gathered to rank 0 on CPU, then a pickle round trip standing in for the hop through Ray's
  object store to the server (the GPU run has the real Ray hop, which is slower), then the snapshot's
  CPU copy (`swarm.server.checkpoints._cpu_copy`) — all on the step's path; its write, ``torch.save`` of
  the state (``trainer_state.pt``) with an fsync, was the background writer's.
- **after** (`VerlTrainer.state_dict`): each rank copies its shard into CPU memory and returns (the
  step's path: ``snapshot_s``); its DCP write runs in a thread of the worker; the checkpoint writer's
  wait for DCP's ``.metadata`` and the move into a checkpoint folder (`commit_state_files`) are the
  background part (``write_s``, from the end of the snapshot).

Also checked: the folder read back unsharded (`read_optimizer_files`) equals the gathered state exactly.
CPU numbers (a shared 2-core box: expect noise); the GPU's are ``multi_gpu.py --resume-check``'s
``save step k: snapshot …`` lines.

Usage: ``PYTHONPATH=. python bench/verl_optimizer_snapshot.py [--hidden 256] [--layers 4] [--rounds 3]
[--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def save_model(directory: Path, hidden: int, layers: int) -> int:
    """A random Llama of SmolLM2's vocabulary with ``hidden`` and ``layers``; returns its parameters."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    from swarm.engine import resolve_model

    source = resolve_model(None)
    config = AutoConfig.from_pretrained(str(source.directory), local_files_only=True)
    config.num_hidden_layers, config.hidden_size, config.intermediate_size = layers, hidden, 4 * hidden
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 4, 2, hidden // 4
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(str(source.directory), local_files_only=True).save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(nbytes(v) for v in value)
    return 0


def max_diff(full: dict[str, Any], read: dict[str, Any]) -> float:
    worst = 0.0
    for name, moments in full["state"].items():
        for key, tensor in moments.items():
            worst = max(
                worst,
                float((torch.as_tensor(tensor) - torch.as_tensor(read["state"][name][key])).abs().max()),
            )
    return worst


def before(trainer: Any, scratch: Path) -> dict[str, float]:
    from swarm.server.checkpoints import _cpu_copy

    started = time.perf_counter()
    full = trainer._workers().optimizer_state()[0]
    gathered = time.perf_counter()
    full = pickle.loads(pickle.dumps(full, protocol=pickle.HIGHEST_PROTOCOL))  # stands in for Ray's hop
    hopped = time.perf_counter()
    _cpu_copy({"verl_optimizer": full})
    snapshot = time.perf_counter()
    path = scratch / "trainer_state.pt"
    with path.open("wb") as f:
        torch.save({"verl_optimizer": full}, f)
        os.fsync(f.fileno())
    written = time.perf_counter()
    path.unlink()
    return {
        "snapshot_s": snapshot - started,
        "gather_s": gathered - started,
        "hop_s": hopped - gathered,
        "write_s": written - snapshot,
    }


def after(trainer: Any, scratch: Path, round_: int) -> dict[str, Any]:
    from swarm.train.state_files import commit_state_files

    started = time.perf_counter()
    state = trainer.state_dict()
    staged = time.perf_counter()
    folder = scratch / f"checkpoint-{round_}"
    folder.mkdir()
    stored = commit_state_files(state, folder)
    committed = time.perf_counter()
    return {
        "snapshot_s": staged - started,
        "write_s": committed - staged,
        "folder": folder / stored["verl_optimizer"].name,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from tests.train.verl_cpu import cpu_worker_group, install_cpu_platform

    install_cpu_platform(free_port())
    from transformers import AutoModelForCausalLM

    from swarm.train import TrainerConfig
    from swarm.train.verl_backend import VerlTrainer, read_optimizer_files
    from tests.train.factories import PAD, make_sample

    with tempfile.TemporaryDirectory(prefix="verl-optimizer-snapshot-") as tmp:
        root = Path(tmp)
        params = save_model(root / "model", args.hidden, args.layers)
        served = AutoModelForCausalLM.from_pretrained(root / "model").eval()
        trainer = VerlTrainer(
            served,
            root / "model",
            TrainerConfig(lr=1e-3),
            PAD,
            start=True,
            worker_group=cpu_worker_group,
            state_dir=root / "checkpoints",
        )
        samples = [make_sample(f"s{k}", 24, 8, seed=k) for k in range(4)]
        trainer.step(samples, [1.0, -1.0, 0.5, -0.5])
        rows: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for round_ in range(args.rounds):
            rows["before"].append(before(trainer, root))
            rows["after"].append(after(trainer, root, round_))
        full = trainer._workers().optimizer_state()[0]["optimizer"]
        read_vs_gathered = max_diff(full, read_optimizer_files(rows["after"][-1]["folder"]))
        optimizer_bytes = nbytes(full["state"])

    def median(path: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[path])

    result = {
        "parameters": params,
        "optimizer_bytes": optimizer_bytes,
        "rounds": args.rounds,
        "before_snapshot_s": median("before", "snapshot_s"),
        "before_gather_s": median("before", "gather_s"),
        "before_hop_s": median("before", "hop_s"),
        "before_write_s": median("before", "write_s"),
        "after_snapshot_s": median("after", "snapshot_s"),
        "after_write_s": median("after", "write_s"),
        "read_vs_gathered": read_vs_gathered,
        "cpu_count": os.cpu_count(),
        "load_avg": os.getloadavg()[0],
    }
    print(
        f"verl optimizer snapshot, CPU, {params / 1e6:.1f} M parameters (AdamW state "
        f"{optimizer_bytes / 2**20:.0f} MiB), median of {args.rounds}:\n"
        f"  before: snapshot {result['before_snapshot_s']:.3f} s on the step's path (gather "
        f"{result['before_gather_s']:.3f} + pickle hop {result['before_hop_s']:.3f} + copy), write "
        f"{result['before_write_s']:.3f} s in the background\n"
        f"  after:  snapshot {result['after_snapshot_s']:.3f} s on the step's path (each rank's shard to CPU), "
        f"write {result['after_write_s']:.3f} s in the background (DCP in the worker, waited for and moved)\n"
        f"  read back vs gathered: max |diff| {read_vs_gathered:g}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
