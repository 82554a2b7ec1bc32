"""Bench: vLLM servers starting beside a training one on the same GPU (the GPU lock, `swarm.engine.gpu_lock`).

This process plays the training server: a `VLLMEngine` (the embedded model, ``--memory`` of the GPU)
that puts vLLM to sleep and wakes it again and again, each sleep lasting ``--step-s`` seconds and
``--gap-s`` seconds between two, as every training step does (`release_memory` … `restore_memory`).
Meanwhile ``--starts`` other processes each start a `VLLMEngine` (``--memory`` each), ``--together`` at a
time, and close it: separate processes, as separate ``swarm serve --engine vllm`` servers are. vLLM 0.25.1
aborts a start whose memory profiling sees the GPU's free memory grow ("Error in memory profiling",
vllm-project/vllm#56830).

``--cycler locked`` (default): the cycles call `release_memory`/`restore_memory`, which hold the lock.
``--cycler unlocked``: the same ``sleep``/``wake_up`` sent to vLLM directly, without the lock, as every
server did before it: the baseline, where starts are expected to fail at random.

Prints one JSON object: per start ``ok``, seconds, whether it logged a wait for the lock, the error's
first line; and the cycles the training side made.

Usage (a GPU with vLLM 0.25.1)::

    python bench/gpu_colocation.py --cycler unlocked    # baseline: expect failed starts
    python bench/gpu_colocation.py                      # with the lock: every start ok
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def start_once(memory: float) -> None:
    """Child mode: start one engine, close it, print ``{"ok": …, "s": …, "error": …}`` as the last line."""
    from swarm.engine import resolve_model
    from swarm.engine.vllm import VLLMEngine

    started = time.monotonic()
    try:
        engine = VLLMEngine(resolve_model(None), gpu_memory_utilization=memory, enforce_eager=True)
    except Exception as exc:
        error = (str(exc).strip() or type(exc).__name__).splitlines()[0][:300]
        print(json.dumps({"ok": False, "s": round(time.monotonic() - started, 1), "error": error}))
        return
    ready_s = time.monotonic() - started
    engine.close()
    print(json.dumps({"ok": True, "s": round(ready_s, 1), "error": None}))


def run_start(memory: float, index: int) -> dict[str, Any]:
    """One start in its own process; its result, and whether it logged a wait for the GPU lock."""
    done = subprocess.run(
        [sys.executable, __file__, "--one-start", "--memory", str(memory)],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result: dict[str, Any] = (
        json.loads(lines[-1])
        if lines
        else {"ok": False, "s": None, "error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
    )
    result["index"] = index
    result["waited_for_lock"] = "waiting for another server's vLLM" in done.stderr
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycler", choices=["locked", "unlocked"], default="locked")
    parser.add_argument("--memory", type=float, default=0.2, help="GPU fraction per engine")
    parser.add_argument("--starts", type=int, default=6)
    parser.add_argument("--together", type=int, default=2, help="starts running at once")
    parser.add_argument("--step-s", type=float, default=1.0, help="seconds asleep per cycle")
    parser.add_argument("--gap-s", type=float, default=0.5, help="seconds awake between cycles")
    parser.add_argument("--one-start", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_start:
        start_once(args.memory)
        return

    import logging

    from swarm.engine import resolve_model
    from swarm.engine.vllm import VLLMEngine

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    trainer = VLLMEngine(resolve_model(None), gpu_memory_utilization=args.memory, enforce_eager=True)
    stop = threading.Event()
    cycles = 0
    cycler_error: str | None = None

    def cycle() -> None:
        nonlocal cycles, cycler_error
        try:
            while not stop.is_set():
                if args.cycler == "locked":
                    trainer.release_memory()
                else:
                    trainer._call(trainer._llm.sleep(level=1))
                time.sleep(args.step_s)
                if args.cycler == "locked":
                    trainer.restore_memory()
                else:
                    trainer._call(trainer._llm.wake_up())
                cycles += 1
                time.sleep(args.gap_s)
        except Exception as exc:  # e.g. vLLM's "Memory usage increased after sleeping" beside a start
            cycler_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]

    cycler = threading.Thread(target=cycle, name="steps")
    cycler.start()
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(args.together) as pool:
            results = list(pool.map(lambda i: run_start(args.memory, i), range(args.starts)))
    finally:
        stop.set()
        cycler.join(120)
        trainer.close()
    print(
        json.dumps(
            {
                "cycler": args.cycler,
                "memory": args.memory,
                "starts": len(results),
                "ok": sum(r["ok"] for r in results),
                "failed": sum(not r["ok"] for r in results),
                "waited_for_lock": sum(r["waited_for_lock"] for r in results),
                "training_cycles": cycles,
                "training_error": cycler_error,
                "wall_s": round(time.monotonic() - started, 1),
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
