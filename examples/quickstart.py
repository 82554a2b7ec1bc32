"""Quickstart: start a swarm server on the embedded model, run one recorded episode, show its record.

    python examples/quickstart.py [--port PORT]

The server runs as a subprocess (``swarm serve``); the agent is a plain OpenAI SDK client that only
knows the episode's ``base_url`` and ``api_key``. The printed record is what training would use.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import httpx
from openai import OpenAI
from rich.console import Console
from rich.table import Table

from swarm.client import SwarmClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"swarm serve exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/openapi.json", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.5)
    sys.exit("swarm serve did not start in time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args()
    console = Console()
    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    run_dir = tempfile.mkdtemp(prefix="swarm-quickstart-")
    console.print(
        f"[bold]starting[/] swarm serve on {url} (run dir {run_dir}); the first start converts the model once"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "swarm.cli",
            "serve",
            "--port",
            str(port),
            "--run-dir",
            run_dir,
            "--log-level",
            "warning",
        ]
    )
    try:
        wait_ready(url, proc)
        with SwarmClient(url, client_id="quickstart") as client:
            with client.episode("quickstart-1") as ep:
                agent = OpenAI(base_url=ep.base_url, api_key=ep.api_key)
                messages = [{"role": "user", "content": "What is 12 + 7? Answer with the number."}]
                first = agent.chat.completions.create(
                    model=ep.model, messages=messages, max_tokens=48, temperature=0
                )
                answer = first.choices[0].message.content or ""
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": "Are you sure?"},
                ]
                second = agent.chat.completions.create(
                    model=ep.model, messages=messages, max_tokens=48, temperature=0
                )
                ep.finish(1.0 if "19" in answer else 0.0)
            view = client.get_episode(ep.id)
        console.print(
            f"[bold]model[/] {ep.model}\n[bold]turn 1[/] {answer!r}\n[bold]turn 2[/] {second.choices[0].message.content!r}"
        )
        table = Table(title=f"episode {view.episode_id} ({view.status.value}, reward {view.reward})")
        for col in ("call", "prompt ids", "completion ids", "mean logprob", "finish", "splices"):
            table.add_column(col)
        for call in view.calls:
            mean_lp = sum(call.logprobs) / max(1, len(call.logprobs))
            table.add_row(
                str(call.index),
                str(len(call.prompt_ids)),
                str(len(call.completion_ids)),
                f"{mean_lp:.3f}",
                call.finish_reason.value,
                str(call.splices),
            )
        console.print(table)
        m = view.merge
        console.print(
            f"merged into {m.samples} training sample(s) from {m.calls} calls (merge ratio {m.merge_ratio:.1f}, {m.tokens_saved} tokens saved)"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
