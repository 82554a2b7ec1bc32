"""Bench: one swarm server across N GPUs of one host, verl's FSDP actor plus vLLM (issue 23).

A random-weight model of a real shape (default: Qwen2.5-1.5B's architecture, ``--shape``) is written in
Hugging Face format to a temporary folder (no download: the vocabulary is the embedded SmolLM2
tokenizer's, 49,152 ids, so every sampled id decodes; Qwen2.5's own vocabulary is 151,936). ``swarm
serve --trainer verl --trainer-gpus N --engine vllm --device cuda`` serves and trains it; ``swarm run``
clients (the letter-share workflow below, ``--groups`` tasks × ``--group-size`` episodes per step, one
completion of ``--completion`` tokens each) feed it until ``--steps`` steps are logged.

Measured per step, from the server's ``GET /api/v1/metrics`` rows and its event log (``events.jsonl``,
same clock):

- **step s**: from the end of the previous step (the first: from the clients' start) to this step's end:
  rollout plus training, the period of the training loop;
- **rollout s**: from the previous step's end to this step's ``train.started`` (sampling, client work and
  the drain); **rollout tok/s** = trained (sampled) tokens of the step / rollout s;
- **sleep s**: vLLM put to sleep before the update (``train.started`` → trainer start);
- **old lp s**, **update s**: verl's ``compute_log_prob`` (π_θ_old) and ``update_actor`` (forward,
  backward and optimizer);
- **gather s**: the actor's full state dict gathered from FSDP through Ray into the server's module
  (``weight_sync_s``); **push s**: vLLM woken and the weights pushed to it (trainer end → ``train.step``;
  with ``--weight-sync direct``: the whole direct sync, CUDA IPC or the NCCL broadcast); **weight sync s**
  = gather + push;
- **GPU GiB**: peak memory used on each GPU during the step (NVML, every 0.5 s; all processes).

Scaling efficiency of N GPUs against one on the same workload (strong scaling, fixed batch):
``E(N) = T(1) / (N · T(N))`` with T the median step time of steps ≥ 2 (step 1 includes the first
CUDA-graph and allocator warm-up). It is printed for the step and for the training part alone (step
minus rollout: vLLM stays one engine on GPU 0). ``--baseline FILE`` takes T(1) from an earlier
``--gpus 1`` run's ``--json``; a ``--gpus 1`` run prints its own T(1) for later runs.

Placement: ``--rollout-gpus 0`` (default) puts vLLM on GPU 0, which verl's rank 0 shares (the direct
path then maps CUDA IPC handles). ``--rollout-gpus 1`` gives vLLM a GPU of its own, after the trainer's:
the bench starts a Ray head itself with the trainer's GPUs only (``CUDA_VISIBLE_DEVICES=0..N-1``, ``ray
start --head --num-gpus N``) and the server with the next GPU only (``CUDA_VISIBLE_DEVICES=N``, ``--ray-address``
to that head), so the direct path broadcasts over NCCL (``swarm.train.weight_transport``). The summary
reports the weight sync per trainer rank count and the transport the server chose (its log line ``verl
weight sync: …``). NCCL cannot place two ranks on one GPU: this layout needs N + 1 GPUs.

NVLink multicast stays off: ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and
``NVSHMEM_DISABLE_NVLS=1`` are set here and in the server's environment (vLLM's engine core and the local
Ray inherit it; ``VerlTrainer`` also passes them to its Ray job's ``runtime_env``). Before stopping, the
bench reads ``/proc/PID/environ`` of the server and every process under it (Ray's raylet and workers,
vLLM's engine core) and reports any that lack them.

Usage, on the GPU host (bench/README.md, ``multi_gpu.py``)::

    export PYTHONPATH=/tmp/verl-site:/tmp/vllm-site:. VLLM_USE_FLASHINFER_SAMPLER=0
    python bench/multi_gpu.py --gpus 1 --steps 3 --json $OUT/multi_gpu.json
    python bench/multi_gpu.py --gpus 2 --steps 3 --baseline multi_gpu.json --json $OUT/multi_gpu_2.json
    # vLLM on a GPU of its own, the weights broadcast over NCCL (N + 1 GPUs):
    python bench/multi_gpu.py --trainer-gpus 2 --rollout-gpus 1 --weight-sync direct --json $OUT/mg_bcast_2.json
    # CPU smoke run of the bench itself (torch trainer, hf engine: verl and vLLM need CUDA):
    python bench/multi_gpu.py --device cpu --shape tiny --trainer torch --engine hf --steps 2 --groups 2 \
        --group-size 2 --completion 8
    # a resume: N steps, SIGKILL after step N's checkpoint, restart, one more step (multi_gpu_resume.py)
    python bench/multi_gpu.py --gpus 1 --steps 2 --resume-check --json $OUT/mg_resume.json
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""Environment that keeps NVLink multicast off (NCCL NVLS, torch symmetric memory, NVSHMEM)."""

# Qwen2.5 architectures as their Hugging Face config.json files give them (vocab_size is set to the
# tokenizer's). "tiny" is a 2-layer toy of the same architecture for the CPU smoke run.
_QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "attention_dropout": 0.0,
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
}
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {
        **_QWEN2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "max_window_layers": 2,
        "tie_word_embeddings": True,
    },
    "0.5b": {
        **_QWEN2,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "max_window_layers": 24,
        "tie_word_embeddings": True,
    },
    "1.5b": {
        **_QWEN2,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "max_window_layers": 21,
        "tie_word_embeddings": True,
    },
    "3b": {
        **_QWEN2,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "max_window_layers": 36,
        "tie_word_embeddings": True,
    },
    "7b": {
        **_QWEN2,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
        "tie_word_embeddings": False,
    },
}
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "List some uses of copper.",
    "Describe a busy market in the morning.",
    "Why do leaves change colour in autumn?",
    "Give advice to someone learning to cook.",
    "Describe the sound of rain on a roof.",
    "What makes a good friend?",
]
START = time.monotonic()


def log(message: str) -> None:
    """A progress line: UTC time and seconds since the bench started (a timeout still shows where it was)."""
    stamp = time.strftime("%H:%M:%S", time.gmtime())
    print(f"[{stamp} +{time.monotonic() - START:6.1f}s] {message}", flush=True)


class BenchError(Exception):
    """A bad argument or a run that cannot go on: one line for the user."""


# ------------------------------------------------------------------------------------------- workflow


async def letters_workflow(task: dict[str, Any], llm: Any) -> float:
    """One chat completion of ``task["max_tokens"]`` tokens at temperature 1; reward = share of ASCII
    letters in the reply (in [0, 1]; it varies within a group, so GRPO's advantages are not all zero).
    ``swarm run bench/multi_gpu.py:letters_workflow`` loads it."""
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as client:
        response = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": task["prompt"]}],
            max_tokens=int(task["max_tokens"]),
            temperature=1.0,
        )
    text = response.choices[0].message.content or ""
    return sum(c.isascii() and c.isalpha() for c in text) / max(len(text), 1)


# ------------------------------------------------------------------------------------------- the model


def build_model(shape: str, directory: Path, seed: int) -> dict[str, Any]:
    """Write a random-weight Qwen2 model of ``shape`` (float32) with the embedded SmolLM2 tokenizer.

    Returns:
        ``{"shape", "parameters", "vocab_size", "config", "build_s"}``.
    """
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from swarm.engine import resolve_model

    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(None).directory))
    fields = {
        **SHAPES[shape],
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = Qwen2Config.from_dict(fields)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float()
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    del model
    return {
        "shape": shape,
        "parameters": parameters,
        "vocab_size": len(tokenizer),
        "config": fields,
        "build_s": time.perf_counter() - t0,
    }


def write_tasks(path: Path, count: int, max_tokens: int) -> None:
    """``count`` JSONL tasks (a prompt and the completion length)."""
    with path.open("w") as f:
        for i in range(count):
            f.write(json.dumps({"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens}) + "\n")


# ------------------------------------------------------------------------------------------- GPU memory


class GpuMemory:
    """Samples every GPU's used memory (all processes) every ``every_s`` seconds in a thread: NVML through
    ``pynvml`` (a vLLM dependency), else ``nvidia-smi``; without either it records nothing and
    :meth:`peaks` returns ``[]``.
    """

    def __init__(self, every_s: float = 0.5) -> None:
        self.samples: list[tuple[float, list[float]]] = []
        """``(time.time(), [GiB used per GPU])``."""
        self.names: list[str] = []
        self.total_gib: list[float] = []
        self._every = every_s
        self._stop = threading.Event()
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.names = [_text(pynvml.nvmlDeviceGetName(h)) for h in self._handles]
            self.total_gib = [pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30 for h in self._handles]
            self._nvml = pynvml
        except Exception:  # no pynvml: nvidia-smi, if there is one
            self._handles = []
            listed = _nvidia_smi("name,memory.total")
            self.names = [row[0] for row in listed]
            self.total_gib = [float(row[1]) / 1024 for row in listed]
        self._thread = threading.Thread(target=self._run, name="gpu-memory", daemon=True)

    def start(self) -> None:
        if self.names:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._handles:
                    used = [self._nvml.nvmlDeviceGetMemoryInfo(h).used / 2**30 for h in self._handles]
                else:
                    used = [float(row[0]) / 1024 for row in _nvidia_smi("memory.used")]
            except Exception:
                return
            self.samples.append((time.time(), used))
            self._stop.wait(self._every)

    def peaks(self, start: float, end: float) -> list[float]:
        """Peak GiB used per GPU between two ``time.time()`` values (``[]`` without samples)."""
        inside = [used for t, used in self.samples if start <= t <= end]
        return [max(col) for col in zip(*inside, strict=True)] if inside else []


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvidia_smi(query: str) -> list[list[str]]:
    """``nvidia-smi --query-gpu=QUERY`` rows (MiB for memory), ``[]`` without nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------- processes


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (from ``/proc/*/status``' PPid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("PPid:"):
                children.setdefault(int(line.split()[1]), []).append(int(entry.name))
                break
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def check_environments(root: int) -> dict[str, Any]:
    """Which processes under ``root`` (inclusive) lack :data:`MULTICAST_OFF` in their environment.

    Returns:
        ``{"processes": n checked, "lacking": ["pid name: VAR=value", ...], "names": {name: count}}``.
    """
    checked, lacking, names = 0, [], {}
    for pid in descendants(root):
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # ended meanwhile
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        name = cmd[0].decode(errors="replace").rsplit("/", 1)[-1][:40] or "?"
        if name.startswith("python") and len(cmd) > 1:
            name = cmd[1].decode(errors="replace").rsplit("/", 1)[-1][:40]
        names[name] = names.get(name, 0) + 1
        checked += 1
        bad = [f"{k}={env.get(k)}" for k, v in MULTICAST_OFF.items() if env.get(k) != v]
        if bad:
            lacking.append(f"{pid} {name}: {', '.join(bad)}")
    return {"processes": checked, "lacking": lacking, "names": names}


def kill_leftovers(session: int) -> int:
    """SIGKILL what is left of the session this bench started the server in (``start_new_session``):
    Ray's raylet and workers (in process groups of their own) can outlive the server and hold GPU memory.

    Returns:
        How many processes were killed.
    """
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:  # fields after the command name: state ppid pgrp session ...
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3]) != session:
                continue
            os.kill(int(entry.name), signal.SIGKILL)
            killed += 1
        except (OSError, ValueError, IndexError):
            continue
    return killed


def stop(proc: subprocess.Popen[bytes] | None, grace_s: float) -> None:
    """SIGTERM a process group this bench started, then SIGKILL it after ``grace_s``."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpu_layout(trainer_gpus: int, rollout_gpus: int) -> dict[str, str | None]:
    """``CUDA_VISIBLE_DEVICES`` of the Ray head (verl's actor) and of the server (vLLM): ``None`` for both
    when vLLM shares the trainer's GPU 0 (the server starts its own Ray), else the trainer's GPUs first
    and vLLM's after them."""
    if rollout_gpus == 0:
        return {"ray": None, "server": None}
    return {
        "ray": ",".join(str(i) for i in range(trainer_gpus)),
        "server": ",".join(str(trainer_gpus + i) for i in range(rollout_gpus)),
    }


def start_ray_head(
    gpus: int, visible: str, env: dict[str, str], log_path: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """A Ray head of ``gpus`` GPUs (``visible``) for verl's actor, in its own session; returns it and its
    address once it accepts connections (at most 120 s).

    Raises:
        BenchError: it exited or did not come up.
    """
    port = free_port()
    argv = [
        sys.executable, "-c", "from ray.scripts.scripts import main; main()",
        "start", "--head", "--block", "--port", str(port), "--num-gpus", str(gpus),
        "--include-dashboard=false", "--disable-usage-stats",
    ]  # fmt: skip
    head = subprocess.Popen(
        argv,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        env={
            **env,
            "CUDA_VISIBLE_DEVICES": visible,
            "PYTHONPATH": absolute_path_list(env.get("PYTHONPATH", "")),
        },
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise BenchError(f"the Ray head exited with {head.returncode}: {last_line(log_path)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            time.sleep(2)  # the GCS answers before the raylet has registered its GPUs
            return head, f"127.0.0.1:{port}"
        time.sleep(1)
    stop(head, 10)
    raise BenchError(f"the Ray head did not come up in 120 s: {last_line(log_path)}")


def absolute_path_list(paths: str) -> str:
    """``PYTHONPATH`` with each entry made absolute: Ray's workers do not start in this folder, and the
    bench's usual ``PYTHONPATH=…:.`` names the repository as ``.``."""
    return os.pathsep.join(str(Path(p).resolve()) for p in paths.split(os.pathsep) if p)


def chosen_transport(server_log: Path) -> str | None:
    """The direct path's transport as the server logged it (``verl weight sync: broadcast (direct)``)."""
    if not server_log.exists():
        return None
    for line in server_log.read_text(errors="replace").splitlines():
        if "verl weight sync: " in line:
            return line.split("verl weight sync: ", 1)[1].split()[0]
    return None


def new_events(path: Path, cursor: list[int]) -> list[dict[str, Any]]:
    """Events appended to ``events.jsonl`` since ``cursor[0]`` (a byte offset, advanced past whole lines)."""
    try:
        with path.open("rb") as f:
            f.seek(cursor[0])
            data = f.read()
    except OSError:
        return []
    whole = data[: data.rfind(b"\n") + 1]
    cursor[0] += len(whole)
    return [json.loads(line) for line in whole.decode(errors="replace").splitlines() if line.strip()]


def last_line(path: Path) -> str:
    """The last non-empty line of a log (for progress lines), at most 160 characters."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:160] if lines else ""


# ------------------------------------------------------------------------------------------- the parts


def rollout_by_version(pool: Path) -> dict[int, dict[str, float]]:
    """Tokens sampled with each policy version and the span of their sampling, from the pool's call records.

    A call of version v was sampled between step v's end and step v + 1's start (the engine holds calls
    back during a step). Its sampling ends at ``created_at + queue_s + generate_s`` (arrival, wait, engine
    time) and starts ``generate_s`` earlier.

    Returns:
        ``{v: {"calls", "tokens", "span_s"}}`` (``span_s``: first sampling start to last end).
    """
    import sqlite3

    if not pool.exists():
        return {}
    db = sqlite3.connect(f"file:{pool}?mode=ro", uri=True)
    try:
        records = [json.loads(row[0]) for row in db.execute("SELECT record FROM calls")]
    finally:
        db.close()
    out: dict[int, dict[str, float]] = {}
    bounds: dict[int, tuple[float, float]] = {}
    for r in records:
        v = int(r["policy_version"])
        end = float(r["created_at"]) + float(r["queue_s"]) + float(r["generate_s"])
        start = end - float(r["generate_s"])
        entry = out.setdefault(v, {"calls": 0, "tokens": 0, "span_s": 0.0})
        entry["calls"] += 1
        entry["tokens"] += len(r["completion_ids"])
        lo, hi = bounds.get(v, (start, end))
        bounds[v] = (min(lo, start), max(hi, end))
        entry["span_s"] = bounds[v][1] - bounds[v][0]
    return out


def step_rows(
    metrics: list[dict[str, Any]],
    events: list[dict[str, Any]],
    sampled: dict[int, dict[str, float]],
    clients_started: float,
    memory: GpuMemory,
) -> list[dict[str, Any]]:
    """One row per logged step: the step's time and its parts (see the module docstring), in seconds.

    Args:
        metrics: ``GET /api/v1/metrics`` rows (``ServerStepMetrics``), oldest first.
        events: The server's ``events.jsonl`` records (``time`` is ``time.time()`` in the server).
        sampled: :func:`rollout_by_version` (the rollout of step k is what policy version k − 1 sampled).
        clients_started: ``time.time()`` when the ``swarm run`` clients were started.
        memory: GPU memory samples.
    """
    started: dict[int, float] = {}
    ended: dict[int, float] = {}
    for ev in events:
        if ev["kind"] == "train.started":
            step = int(ev["message"].split(":", 1)[0].removeprefix("training step "))
            started[step] = float(ev["time"])  # a failed and retried step: its last start
        elif ev["kind"] == "train.step":
            ended[int(ev["data"]["step"])] = float(ev["time"])
    rows = []
    previous_end = clients_started
    for m in metrics:
        k = int(m["step"])
        t = m["time_s"]
        start, end = started.get(k), ended.get(k)
        if start is None or end is None:
            break  # its events are not written yet
        trainer_end = float(m["created_at"])
        trainer_start = trainer_end - t["total_s"]
        push = max(0.0, end - trainer_end - m["checkpoint_s"])
        rollout = start - previous_end
        roll = sampled.get(k - 1, {})
        rows.append(
            {
                "step": k,
                "step_s": end - previous_end,
                "rollout_s": rollout,
                "drain_s": m["drain_s"],
                "train_s": end - start,
                "sleep_s": max(0.0, trainer_start - start),
                "old_logprobs_s": t["old_logprobs_s"],
                "ref_logprobs_s": t["ref_logprobs_s"],
                "update_s": t["fwd_bwd_s"] + t["optim_s"],
                "gather_s": t["weight_sync_s"],
                "push_s": push,
                "weight_sync_s": t["weight_sync_s"] + push,
                "trainer_s": t["total_s"],
                "checkpoint_s": m["checkpoint_s"],
                "episodes": m["episodes"],
                "tokens": m["tokens"],
                "rollout_tokens": roll.get("tokens"),
                "rollout_sampling_s": roll.get("span_s"),
                "rollout_tokens_per_s": roll["tokens"] / roll["span_s"] if roll.get("span_s") else None,
                "reward_mean": m["reward_mean"],
                "loss": m["loss"],
                "grad_norm": m["grad_norm"],
                "drift": m["logprob_drift_mean"],
                "staleness_mean": m["staleness_mean"],
                "gpu_peak_gib": memory.peaks(previous_end, end),
            }
        )
        previous_end = end
    return rows


def summarize(
    rows: list[dict[str, Any]],
    gpus: int,
    baseline: dict[str, Any] | None,
    *,
    rollout_gpus: int = 0,
    transport: str | None = None,
) -> dict[str, Any]:
    """Medians over steps ≥ 2 (all steps when there is one) and the scaling efficiency against a baseline.

    ``E(N) = T(1) / (N · T(N))`` for the step time and for the training part (step − rollout).
    ``sync_by_ranks``: the median weight sync (s) by trainer rank count, this run's and the baseline's,
    with the layout (``rollout_gpus``) and the direct path's transport.
    """
    later = rows[1:] or rows
    out: dict[str, Any] = {"steps_in_median": [r["step"] for r in later]}
    for key in (
        "step_s",
        "rollout_s",
        "train_s",
        "old_logprobs_s",
        "update_s",
        "gather_s",
        "push_s",
        "weight_sync_s",
        "rollout_tokens_per_s",
    ):
        values = [r[key] for r in later if r[key] is not None]
        out[f"median_{key}"] = statistics.median(values) if values else None
    peaks = [r["gpu_peak_gib"] for r in rows if r["gpu_peak_gib"]]
    out["gpu_peak_gib"] = [max(col) for col in zip(*peaks, strict=True)] if peaks else []
    out["gpus"] = gpus
    out["rollout_gpus"] = rollout_gpus
    out["transport"] = transport
    sync = out["median_weight_sync_s"]
    out["weight_sync_share"] = (
        sync / out["median_step_s"] if sync is not None and out["median_step_s"] else None
    )
    out["sync_by_ranks"] = {
        str(gpus): {"weight_sync_s": sync, "rollout_gpus": rollout_gpus, "transport": transport}
    }
    if baseline is not None:
        b = baseline["summary"]
        out["sync_by_ranks"] = {**b.get("sync_by_ranks", {}), **out["sync_by_ranks"]}
    if baseline is not None and out["median_step_s"]:
        b = baseline["summary"]
        out["baseline_gpus"] = b["gpus"]
        for key in ("step_s", "train_s"):
            t1, tn = b[f"median_{key}"], out[f"median_{key}"]
            # T(1)/(N·T(N)), for a baseline of N₀ GPUs: N₀·T(N₀)/(N·T(N))
            out[f"efficiency_{key}"] = (b["gpus"] * t1) / (gpus * tn) if t1 and tn else None
    return out


def print_report(rows: list[dict[str, Any]], summary: dict[str, Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 180)
    table = Table(title=title)
    columns = [
        ("step", "step"), ("step s", "step_s"), ("rollout s", "rollout_s"), ("sleep s", "sleep_s"),
        ("old lp s", "old_logprobs_s"), ("update s", "update_s"), ("gather s", "gather_s"),
        ("push s", "push_s"), ("weight sync s", "weight_sync_s"), ("tokens", "tokens"),
        ("rollout tok/s", "rollout_tokens_per_s"), ("reward", "reward_mean"), ("grad norm", "grad_norm"),
        ("GPU GiB", "gpu_peak_gib"),
    ]  # fmt: skip
    for header, _ in columns:
        table.add_column(header, justify="right")
    for row in rows:
        cells = []
        for _, key in columns:
            v = row[key]
            if isinstance(v, list):
                cells.append(" / ".join(f"{x:.1f}" for x in v) or "n/a")
            elif isinstance(v, float):
                cells.append(f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}")
            else:
                cells.append("n/a" if v is None else str(v))
        table.add_row(*cells)
    console.print(table)

    def fmt(v: float | None, unit: str = " s") -> str:
        return "n/a" if v is None else f"{v:.2f}{unit}"

    s = summary
    console.print(
        f"median over steps {s['steps_in_median']}: step {fmt(s['median_step_s'])} = rollout "
        f"{fmt(s['median_rollout_s'])} + train {fmt(s['median_train_s'])} (old logprobs "
        f"{fmt(s['median_old_logprobs_s'])}, update {fmt(s['median_update_s'])}, weight sync "
        f"{fmt(s['median_weight_sync_s'])} = gather {fmt(s['median_gather_s'])} + push "
        f"{fmt(s['median_push_s'])}); rollout {fmt(s['median_rollout_tokens_per_s'], ' tok/s')}"
    )
    ranks = sorted(s.get("sync_by_ranks", {}).items(), key=lambda kv: int(kv[0]))
    if ranks:
        parts = [
            f"{n} rank(s) {fmt(v['weight_sync_s'])} ({v['transport'] or 'gather'}, vLLM "
            f"{'on its own GPU' if v['rollout_gpus'] else 'on GPU 0'})"
            for n, v in ranks
        ]
        share = s.get("weight_sync_share")
        console.print(
            f"weight sync by trainer rank count: {'; '.join(parts)}"
            + (f"; this run: {share:.0%} of the step" if share is not None else "")
        )
    if "efficiency_step_s" in s:
        console.print(
            f"scaling efficiency E(N) = N₀·T(N₀) / (N·T(N)), N = {s['gpus']} against N₀ = {s['baseline_gpus']}: "
            f"step {fmt(s['efficiency_step_s'], '')}, training part {fmt(s['efficiency_train_s'], '')}"
        )
    elif s["gpus"] == 1:
        console.print(
            f"baseline for E(N) = T(1) / (N·T(N)): T(1) = {fmt(s['median_step_s'])} (step), "
            f"{fmt(s['median_train_s'])} (training part); pass this --json as --baseline to an N-GPU run"
        )


# ------------------------------------------------------------------------------------------- the run


def check_args(a: dict[str, Any]) -> dict[str, Any] | None:
    """Refuse bad arguments before anything starts; returns the baseline run (or ``None``).

    Raises:
        BenchError: the first problem, in one line.
    """
    import importlib.util

    if a["weight_sync"] not in ("gather", "direct", "ipc", "broadcast"):
        raise BenchError(f"--weight-sync is gather, direct, ipc or broadcast, got {a['weight_sync']!r}")
    if a["lora_rank"] < 0 or (a["max_staleness"] is not None and a["max_staleness"] < 0):
        raise BenchError("--lora-rank and --max-staleness must be ≥ 0")
    if a["rollout_gpus"] not in (0, 1):
        raise BenchError(
            f"--rollout-gpus {a['rollout_gpus']}: 0 (vLLM on the trainer's GPU 0) or 1 (a GPU of its own; "
            "the vLLM engine runs one worker, no tensor parallelism)"
        )
    if a["rollout_gpus"] and (a["trainer"] != "verl" or a["engine"] != "vllm"):
        raise BenchError(
            "--rollout-gpus 1 places verl's actor and vLLM apart: it needs --trainer verl --engine vllm"
        )
    for name in ("gpus", "steps", "groups", "completion", "checkpoint_every"):
        if a[name] < 1:
            raise BenchError(f"--{name} must be ≥ 1, got {a[name]}")
    if a["group_size"] < 2:
        raise BenchError(f"--group-size must be ≥ 2 (GRPO needs a group), got {a['group_size']}")
    if a["shape"] not in SHAPES:
        raise BenchError(f"--shape {a['shape']!r}: one of {', '.join(SHAPES)}")
    if a["trainer"] not in ("verl", "torch") or a["engine"] not in ("vllm", "hf"):
        raise BenchError("--trainer is verl or torch, --engine vllm or hf")
    if a["device"] not in ("cuda", "cpu"):
        raise BenchError(f"--device is cuda or cpu, got {a['device']!r}")
    if a["device"] == "cpu":
        if a["trainer"] == "verl" or a["engine"] == "vllm":
            raise BenchError(
                "--device cpu: verl's FSDP workers and vLLM need CUDA GPUs; the CPU smoke run is "
                "--device cpu --shape tiny --trainer torch --engine hf"
            )
        if a["shape"] != "tiny":
            raise BenchError(f"--device cpu runs --shape tiny only (not {a['shape']})")
    if a["gpus"] > 1 and a["trainer"] != "verl":
        raise BenchError(f"--gpus {a['gpus']} needs --trainer verl (the torch trainer uses one device)")
    if a["trainer"] == "verl" and importlib.util.find_spec("verl") is None:
        raise BenchError(
            "--trainer verl: verl is not importable (PYTHONPATH=/tmp/verl-site:/tmp/vllm-site:. ?)"
        )
    if a["engine"] == "vllm" and importlib.util.find_spec("vllm") is None:
        raise BenchError(
            "--engine vllm: vLLM is not importable (PYTHONPATH=/tmp/verl-site:/tmp/vllm-site:. ?)"
        )
    if a["device"] == "cuda":
        import torch

        visible = torch.cuda.device_count()
        if visible < a["gpus"] + a["rollout_gpus"]:
            raise BenchError(
                f"--gpus {a['gpus']} --rollout-gpus {a['rollout_gpus']}: this machine has {visible} CUDA GPU(s)"
            )
    if a["json_out"] is not None and not Path(a["json_out"]).parent.is_dir():
        raise BenchError(f"--json {a['json_out']}: its folder does not exist")
    if a["budget"] < 60:
        raise BenchError(f"--budget {a['budget']} s is too short to start a server")
    if a["baseline"] is None:
        return None
    try:
        baseline: dict[str, Any] = json.loads(Path(a["baseline"]).read_text())
        if not isinstance(baseline["summary"]["median_step_s"], float):  # a KeyError: another bench's file
            raise TypeError("median_step_s is not a number")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"--baseline {a['baseline']}: not a multi_gpu.py --json result ({exc})") from None
    return baseline


def swarm_command() -> list[str]:
    exe = Path(sys.executable).parent / "swarm"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "swarm.cli"]


def serve_argv(
    a: dict[str, Any], model_dir: Path, run_dir: Path, port: int, ray_address: str | None = None
) -> list[str]:
    argv = [
        *swarm_command(), "serve",
        "--model", str(model_dir),
        "--trainer", a["trainer"],
        "--engine", a["engine"],
        "--device", a["device"],
        "--dtype", "float32",
        "--run-dir", str(run_dir),
        "--port", str(port),
        "--batch-policy", "tasks",
        "--batch-size", str(a["groups"]),
        "--group-size", str(a["group_size"]),
        "--lr", str(a["lr"]),
        "--micro-batch-size", str(a["micro_batch_size"]),
        # by default no checkpoint inside the measured steps (a 1.5B float32 one is 6 GB, 18 GB with AdamW)
        "--checkpoint-every", str(a["checkpoint_every"]),
    ]  # fmt: skip
    if a["trainer"] == "verl" and a["weight_sync"] != "gather":
        argv += ["--verl-weight-sync", a["weight_sync"]]
    if a["lora_rank"] > 0:
        argv += ["--lora-rank", str(a["lora_rank"])]
    if a["max_staleness"] is not None:
        argv += ["--max-staleness", str(a["max_staleness"]), "--tis-cap", "2.0"]
    if a["trainer"] == "verl":
        argv += ["--trainer-gpus", str(a["gpus"])]
    if ray_address is not None:
        argv += ["--ray-address", ray_address]
    if a["engine"] == "vllm":
        argv += ["--gpu-memory-utilization", str(a["gpu_memory_utilization"])]
    if a["device"] == "cpu":
        argv += ["--threads", "1"]
    return argv


def wait_ready(server: subprocess.Popen[bytes], url: str, server_log: Path, deadline: float) -> None:
    """Wait until the server answers ``GET /api/v1/status`` (a progress line every 15 s).

    Raises:
        BenchError: it exited, or ``deadline`` (``time.monotonic()``) passed.
    """
    import httpx

    last_note = 0.0
    while True:
        if server.poll() is not None:
            raise BenchError(f"the server exited with {server.returncode}: {last_line(server_log)}")
        try:
            if httpx.get(f"{url}/api/v1/status", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise BenchError(
                f"the server did not come up within --budget; last log line: {last_line(server_log)}"
            )
        if time.monotonic() - last_note > 15:
            last_note = time.monotonic()
            log(f"waiting for the server: {last_line(server_log)}")
        time.sleep(1)


def client_argv(a: dict[str, Any], url: str, tasks: Path, state_dir: Path) -> list[str]:
    """``swarm run`` of the letters workflow over ``tasks``, one group of each task at a time."""
    return [
        *swarm_command(), "run", f"{Path(__file__).resolve()}:letters_workflow",
        "--server", url,
        "--dataset", str(tasks),
        "--group-size", str(a["group_size"]),
        "--concurrency", str(a["groups"] * a["group_size"]),
        "--epochs", "1",
        "--state-dir", str(state_dir),
        "--fresh",
        "--no-progress",
    ]  # fmt: skip


def run(a: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, Any]:
    """Build the model, start the server and clients, collect ``--steps`` steps; stop everything."""
    import httpx

    deadline = START + a["budget"]
    work = Path(tempfile.mkdtemp(prefix="swarm-multi-gpu-", dir=a["work_dir"]))
    logs = Path(a["json_out"]).parent if a["json_out"] is not None else work
    server_log, client_log = logs / "multi_gpu_server.log", logs / "multi_gpu_clients.log"
    env = {**os.environ, **MULTICAST_OFF}
    result: dict[str, Any] = {
        "args": {k: str(v) for k, v in a.items()},
        "complete": False,
        "where": "building the model",
        "logs": [str(server_log), str(client_log)],
    }
    memory = GpuMemory()
    if memory.names:
        result["gpu"] = {"names": memory.names, "total_gib": memory.total_gib}
    server = clients = ray_head = None
    metrics: list[dict[str, Any]] = []
    layout = gpu_layout(a["gpus"], a["rollout_gpus"])
    result["gpu_layout"] = layout
    clients_started = time.time()
    try:
        log(f"building a random {a['shape']} Qwen2 model in {work / 'model'}")
        result["model"] = build_model(a["shape"], work / "model", a["seed"])
        log(
            f"model: {result['model']['parameters'] / 1e9:.3f} B parameters (vocab {result['model']['vocab_size']}), "
            f"written in {result['model']['build_s']:.1f} s"
        )
        tasks = work / "tasks.jsonl"
        write_tasks(tasks, a["groups"] * (a["steps"] + 2), a["completion"])
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        ray_address = None
        if layout["ray"] is not None:
            result["where"] = "starting the Ray head"
            ray_head, ray_address = start_ray_head(a["gpus"], layout["ray"], env, logs / "multi_gpu_ray.log")
            log(
                f"Ray head for the trainer on GPU(s) {layout['ray']} at {ray_address}; vLLM on GPU {layout['server']}"
            )
        server_env = env if layout["server"] is None else {**env, "CUDA_VISIBLE_DEVICES": layout["server"]}
        argv = serve_argv(a, work / "model", work / "run", port, ray_address)
        result["serve_argv"] = argv
        memory.start()
        log(f"starting: {' '.join(argv[1:])}  (log: {server_log})")
        t_serve = time.time()
        result["where"] = "starting the server"
        server = subprocess.Popen(
            argv,
            stdout=server_log.open("wb"),
            stderr=subprocess.STDOUT,
            env=server_env,
            start_new_session=True,
        )
        wait_ready(server, url, server_log, deadline)
        result["server_ready_s"] = time.time() - t_serve
        log(f"server ready in {result['server_ready_s']:.1f} s")

        result["where"] = "rolling out and training"
        clients_started = time.time()
        clients = subprocess.Popen(
            client_argv(a, url, tasks, work / "clients"),
            stdout=client_log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log(
            f"clients started: {a['groups']} tasks × {a['group_size']} episodes per step, {a['completion']} tokens each"
        )
        seen, last_note, cursor = 0, time.monotonic(), [0]
        while len(metrics) < a["steps"]:
            if server.poll() is not None:
                raise BenchError(f"the server exited with {server.returncode}: {last_line(server_log)}")
            if time.monotonic() > deadline:
                raise BenchError(f"--budget reached after {len(metrics)} of {a['steps']} steps")
            for ev in new_events(work / "run" / "events.jsonl", cursor):
                if ev["kind"] in ("train.failed", "train.skipped"):  # the server logs them and goes on
                    log(f"server event {ev['kind']}: {ev['message'][:300]}")
                    if ev["kind"] == "train.failed":
                        raise BenchError(f"a training step failed: {ev['message'][:300]}")
            try:
                metrics = httpx.get(f"{url}/api/v1/metrics", timeout=30).json()
            except httpx.HTTPError as exc:  # a slow answer during a step: ask again
                log(f"GET /api/v1/metrics: {type(exc).__name__}; retrying")
                time.sleep(2)
                continue
            for m in metrics[seen:]:
                t = m["time_s"]
                log(
                    f"step {m['step']}: {m['tokens']} tokens, reward {m['reward_mean']:.3f}, trainer "
                    f"{t['total_s']:.2f} s (old logprobs {t['old_logprobs_s']:.2f}, update {t['fwd_bwd_s']:.2f}, "
                    f"gather {t['weight_sync_s']:.2f})"
                )
            seen = len(metrics)
            if time.monotonic() - last_note > 20:
                last_note = time.monotonic()
                where = last_line(server_log)
                log(
                    f"{len(metrics)}/{a['steps']} steps; clients: {'running' if clients.poll() is None else 'ended'}; server: {where}"
                )
            if clients.poll() is not None and clients.returncode != 0:
                raise BenchError(f"the clients exited with {clients.returncode}: {last_line(client_log)}")
            time.sleep(1)
        result["where"] = "collecting"
        result["environments"] = check_environments(server.pid)
        result["complete"] = True
    except Exception as exc:  # anything: stop the processes, keep what was measured, report it
        result["error"] = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
        log(f"stopped: {result['error']}")
    finally:
        stop(clients, 10)
        if server is not None and server.poll() is None:
            # the check also when the run stopped early (if the server is still up)
            with contextlib.suppress(OSError):
                result.setdefault("environments", check_environments(server.pid))
        stop(server, 30)
        if server is not None and (leftovers := kill_leftovers(server.pid)):
            log(f"killed {leftovers} process(es) of the server's session that outlived it")
        stop(ray_head, 30)
        if ray_head is not None and (leftovers := kill_leftovers(ray_head.pid)):
            log(f"killed {leftovers} process(es) of the Ray head's session that outlived it")
        memory.stop()
        events_file = work / "run" / "events.jsonl"
        events = (
            [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
            if events_file.exists()
            else []
        )
        if events_file.exists():
            shutil.copy(events_file, logs / "multi_gpu_events.jsonl")
        try:
            sampled = rollout_by_version(work / "run" / "pool.db")
        except Exception as exc:  # the step table is still worth printing
            log(f"could not read the call records: {type(exc).__name__}: {exc}")
            sampled = {}
        if not a["keep"]:
            shutil.rmtree(work, ignore_errors=True)
    result["sampled_by_version"] = sampled
    # the steps asked for: the server may finish one more while it is being stopped
    rows = step_rows(metrics, events, sampled, clients_started, memory)[: a["steps"]]
    result["rows"] = rows
    result["metrics"] = metrics
    if rows:
        transport = chosen_transport(server_log) if a["weight_sync"] != "gather" else None
        result["summary"] = summarize(
            rows, a["gpus"], baseline, rollout_gpus=a["rollout_gpus"], transport=transport
        )
        model = result.get("model", {})
        print_report(
            rows,
            result["summary"],
            f"swarm serve --trainer {a['trainer']} --trainer-gpus {a['gpus']} --engine {a['engine']}"
            f"{' (vLLM on its own GPU)' if a['rollout_gpus'] else ''}: "
            f"{a['shape']} ({model.get('parameters', 0) / 1e9:.2f} B), {a['groups']} × {a['group_size']} × "
            f"{a['completion']} tokens a step",
        )
    env_check = result.get("environments")
    if env_check is not None:
        state = "all have it" if not env_check["lacking"] else f"LACKING: {env_check['lacking'][:5]}"
        log(
            f"NVLink multicast off in {env_check['processes']} server processes: {state} ({env_check['names']})"
        )
    return result


def main(
    gpus: Annotated[
        int,
        typer.Option(
            "--gpus", "--trainer-gpus", help="GPUs of verl's FSDP actor (swarm serve --trainer-gpus)."
        ),
    ] = 1,
    rollout_gpus: Annotated[
        int,
        typer.Option(
            help="GPUs of vLLM's own: 0 = on the trainer's GPU 0 (CUDA IPC), 1 = the next GPU (NCCL)."
        ),
    ] = 0,
    steps: Annotated[int, typer.Option(help="Training steps to log.")] = 3,
    shape: Annotated[
        str, typer.Option(help="Model architecture: tiny | 0.5b | 1.5b | 3b | 7b (Qwen2.5's).")
    ] = "1.5b",
    device: Annotated[
        str, typer.Option(help="cuda | cpu (cpu: the smoke run, tiny shape, torch + hf).")
    ] = "cuda",
    trainer: Annotated[str, typer.Option(help="verl | torch")] = "verl",
    engine: Annotated[str, typer.Option(help="vllm | hf")] = "vllm",
    groups: Annotated[int, typer.Option(help="B: tasks (GRPO groups) per step.")] = 8,
    group_size: Annotated[int, typer.Option(help="G: episodes per task.")] = 4,
    completion: Annotated[int, typer.Option(help="Completion tokens per episode (max_tokens).")] = 256,
    micro_batch_size: Annotated[int, typer.Option(help="Sequences per forward/backward pass.")] = 8,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-6,
    weight_sync: Annotated[
        str, typer.Option(help="verl: gather | direct | ipc | broadcast (swarm serve --verl-weight-sync).")
    ] = "gather",
    lora_rank: Annotated[int, typer.Option(help="LoRA rank (swarm serve --lora-rank); 0: all weights.")] = 0,
    max_staleness: Annotated[
        int | None, typer.Option(help="Asynchronous training (swarm serve --max-staleness K, --tis-cap 2).")
    ] = None,
    checkpoint_every: Annotated[
        int, typer.Option(help="swarm serve --checkpoint-every (default: none in the measured steps).")
    ] = 1_000_000,
    gpu_memory_utilization: Annotated[float, typer.Option(help="vLLM's share of GPU 0.")] = 0.3,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    budget: Annotated[
        float, typer.Option(help="Seconds for the whole bench; then it stops and reports.")
    ] = 520.0,
    baseline: Annotated[
        Path | None, typer.Option(help="--json of an earlier run (e.g. --gpus 1) for E(N).")
    ] = None,
    work_dir: Annotated[
        Path | None, typer.Option(help="Where the model and run dir go (default: /tmp).")
    ] = None,
    keep: Annotated[bool, typer.Option(help="Keep the model and the run dir.")] = False,
    resume_check: Annotated[
        bool,
        typer.Option(
            help="Train --steps steps (checkpoint every step), SIGKILL the server, restart it on its run dir, "
            "train one more: the step counter, AdamW's continuity, save and load times (multi_gpu_resume.py)."
        ),
    ] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the result here (and the logs beside it).")
    ] = None,
) -> None:
    """Train a random-weight model of a real shape with verl's FSDP actor on N GPUs from swarm run clients."""
    os.environ.update(MULTICAST_OFF)
    a = dict(locals())
    try:
        base = check_args(a)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    log(
        f"multi_gpu bench: {' '.join(sys.argv[1:])}  ({', '.join(f'{k}={v}' for k, v in MULTICAST_OFF.items())})"
    )
    if resume_check:
        from multi_gpu_resume import resume_check as check_resume

        result = check_resume(a)
    else:
        result = run(a, base)
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=1, default=str))
        log(f"wrote {json_out}")
    if not result["complete"]:
        print(f"error: incomplete ({result['where']}): {result.get('error')}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    typer.run(main)
