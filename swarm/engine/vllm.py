"""The ``vllm`` engine: continuous batching on a GPU with vLLM's ``AsyncLLM``, token ids in and out.

The server renders and splices prompts itself and hands vLLM the prompt ids (``TokensPrompt``), so the
tracker's ids stay the record; vLLM never sees messages. vLLM runs its scheduler in an engine-core
process; this object drives it from a private event loop in a background thread (so the server's
loop, the trainer's thread and tests can all call it) and bridges each request to the caller's loop.

Recording convention (shared with the ``hf`` engine and the trainer): ``Completion.logprobs[t]`` is
``log_softmax(logits)[id_t]`` of the raw fp32 logits, i.e. temperature 1 and no top-p/top-k
truncation, whatever the request's sampling parameters (vLLM ``logprobs_mode="raw_logprobs"``).

A request with ``n`` choices is sent as ``n`` vLLM requests of one choice each, choice ``i`` seeded
with ``seed + i`` like the ``hf`` engine; vLLM's prefix cache shares their prompt.

Training on the same GPU (colocated): the trainer updates its own Hugging Face copy of the weights
(`trainable_module`); around a step the engine pauses new requests (`pause`), puts vLLM to sleep to
free its KV cache (`release_memory`), and afterwards pushes the new weights into the running engine
through CUDA IPC handles (`load_weights`, see `swarm.engine._vllm_worker`) and resets the prefix
cache, so the next call is sampled, and recorded, with the new ``policy_version``. Everything that moves
GPU memory (start-up, the sleep → step → wake window, stop) runs under the GPU's host-wide lock
(`swarm.engine.gpu_lock`), so other vLLM servers on the GPU never profile memory meanwhile.

LoRA tenants (``swarm serve --tenants N``, `swarm.server.tenants`): built with ``max_loras = N`` vLLM
serves one LoRA adapter per request (``LoRARequest``, `SamplingParams.adapter`), several adapters in one
continuous batch. After a tenant's step `serve_adapter` writes its adapter to a folder and hot-loads it
under a fresh LoRA id (``add_lora``; the old id is removed), so vLLM's prefix cache, whose block hashes
include the LoRA id, stays valid per adapter and no other tenant's cache is reset; the other tenants keep
sampling during a tenant's step (the trainer updates its own copy). UNTESTED on a GPU so far: the
command to run is in bench/README.md (LoRA tenants).

vLLM is an optional dependency (``pip install 'a3r[vllm]'``, vLLM 0.25.1 for torch 2.11 + CUDA 13); it
is imported when the engine is built, never at module import.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import logging
import multiprocessing
import os
import pickle
import shutil
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch

from swarm.engine.base import Completion, SampledToken, SamplingParams, TokenCallback
from swarm.engine.gpu_lock import STOP_TIMEOUT_S, GpuLockTimeout, gpu_lock
from swarm.engine.limits import check_prompt_fits, check_score_input, end_of_turn_ids, max_new_tokens
from swarm.engine.model_loading import ModelSource, load_model
from swarm.errors import ModelLoadError
from swarm.tracking.records import FinishReason

T = TypeVar("T")
log = logging.getLogger(__name__)

WORKER_EXTENSION = "swarm.engine._vllm_worker.WeightReceiver"
MAX_TOP_LOGPROBS = 20
ENGINE_CORE_PROCESS = "EngineCore"  # the name vLLM gives its engine-core process


class EngineUnavailable(ModelLoadError):
    """The ``vllm`` engine cannot run here (vLLM not installed, or no CUDA GPU)."""


def check_vllm_available() -> None:
    """Raise `EngineUnavailable` with one readable line unless vLLM is installed and a GPU is visible.

    Cheap: looks vLLM up without importing it (``swarm serve --check`` calls this).
    """
    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailable(
            "--engine vllm: vLLM is not installed here: pip install 'a3r[vllm]' "
            "(vLLM 0.25.1 for torch 2.11 + CUDA 13)"
        )
    if not torch.cuda.is_available():
        raise EngineUnavailable("--engine vllm: needs a CUDA GPU, and torch sees none here")


def served_weights(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights to serve, named as the Hugging Face checkpoint names them.

    A peft LoRA model yields its merged weights ``W + (α/r)·B·A`` (Hu et al. 2021, eq. 3), computed in
    float32 from the frozen base and cast back to the base dtype; adapter tensors themselves are not
    yielded. A plain model yields its ``state_dict``.

    Yields:
        ``(name, tensor)`` pairs; tensors are contiguous and on the module's device.
    """
    base_prefix = "base_model.model."
    from peft.tuners.lora import LoraLayer

    lora_layers: dict[str, Any] = {}
    for name, sub in module.named_modules():
        if isinstance(sub, LoraLayer):
            lora_layers[name.removeprefix(base_prefix)] = sub
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            name = name.removeprefix(base_prefix)
            if ".lora_" in name:
                continue
            if ".base_layer." in name:
                layer_name, _, leaf = name.partition(".base_layer.")
                name = f"{layer_name}.{leaf}"
                layer = lora_layers.get(layer_name)
                if layer is not None and leaf == "weight":
                    merged = tensor.float()
                    for adapter in layer.active_adapters:
                        merged = merged + layer.get_delta_weight(adapter).float()
                    tensor = merged.to(tensor.dtype)
            yield name, tensor.contiguous()


class VLLMEngine:
    """Continuous-batching sampler over vLLM's ``AsyncLLM`` (implements `swarm.engine.base.Engine`).

    Args:
        source: the model directory (Hugging Face format) and its served name.
        dtype: weights dtype vLLM serves in (``"float32"``, ``"bfloat16"``, ``"float16"``).
        device: the trainer's device for `trainable_module` (vLLM itself uses the visible GPU).
        gpu_memory_utilization: fraction of the GPU vLLM may take for weights + KV cache (0, 1].
        max_model_len: context window in tokens; ``None`` takes the model config's.
        seed: vLLM's global seed (requests without a seed draw from it).
        enforce_eager: skip CUDA graph capture (faster start, slower decode).
        max_loras: LoRA adapters served at once (tenants); ``0`` starts vLLM without LoRA.
        max_lora_rank: the largest adapter rank it must serve (rounded up to a power of two ≥ 8).

    Raises:
        EngineUnavailable: vLLM is not installed or no CUDA GPU is visible.
        ModelLoadError: vLLM cannot load the model or cannot get the memory asked for.
    """

    def __init__(
        self,
        source: ModelSource,
        *,
        dtype: str = "float32",
        device: str = "cuda",
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        seed: int = 0,
        enforce_eager: bool = False,
        max_loras: int = 0,
        max_lora_rank: int = 16,
    ) -> None:
        check_vllm_available()
        # vLLM's engine core is a child process; torch has usually touched CUDA here already, and CUDA
        # cannot be re-initialised in a forked child.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        directory = str(source.directory)
        config = AutoConfig.from_pretrained(directory)
        _check_can_serve(config, gpu_memory_utilization)
        self._gpu = gpu_lock()
        """Held while this engine moves GPU memory (start, sleep → step → wake, stop): see
        `swarm.engine.gpu_lock`; other vLLM servers on this GPU then start or step at other times."""
        self._sleep_hold = False
        """Whether this engine holds ``_gpu`` for a sleep window (`release_memory` → `restore_memory`)."""
        self.source = source
        self.model_name = source.name
        self.dtype = dtype
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        window: int = getattr(config, "max_position_embeddings", 2048)
        self.max_context = int(max_model_len if max_model_len is not None else window)
        self._vocab_size = int(config.vocab_size)
        generation: Any = None
        with contextlib.suppress(OSError):  # a model directory without generation_config.json
            generation = GenerationConfig.from_pretrained(directory)
        self.stop_ids = end_of_turn_ids((generation, config), self.tokenizer)
        self.policy_version = 0
        self.samples_while_training = max_loras > 0
        """Tenants: another tenant's step trains the trainer's copy, so sampling goes on meanwhile."""
        # vLLM accepts a few ranks only (8, 16, 32, …): the smallest power of two ≥ 8 that fits the adapters
        self._max_loras, self._max_lora_rank = max_loras, max(8, 1 << (max_lora_rank - 1).bit_length())
        self._loras: dict[str, tuple[Any, int]] = {}
        """Adapter name → (its current ``LoRARequest``, its policy version)."""
        self._lora_ids = itertools.count(1)
        self._lora_dir = Path(tempfile.mkdtemp(prefix="swarm-lora-")) if max_loras else None
        self._pause_lock = threading.RLock()
        self._pause_depth = 0
        self._ids = itertools.count()
        self._inflight = 0
        self._sleeping = False
        self._closed = False
        self._trainable: torch.nn.Module | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine", daemon=True)
        self._thread.start()
        self._open: asyncio.Event = self._call(self._make_event())
        self._idle: asyncio.Condition = self._call(self._make_condition())
        try:
            with self._gpu.hold("start"):  # vLLM's profiling and KV-cache sizing read device-wide free memory
                _check_free_memory(gpu_memory_utilization)
                self._llm = self._call(self._start(directory, gpu_memory_utilization, seed, enforce_eager))
        except ModelLoadError:
            self._stop_loop()
            raise
        except Exception as exc:
            self._stop_loop()
            raise ModelLoadError(f"vLLM could not start {source.name}: {_first_line(exc)}") from exc

    # -- construction on the engine loop ---------------------------------------------------------------
    @staticmethod
    async def _make_event() -> asyncio.Event:
        event = asyncio.Event()
        event.set()
        return event

    @staticmethod
    async def _make_condition() -> asyncio.Condition:
        return asyncio.Condition()

    async def _start(self, directory: str, memory: float, seed: int, enforce_eager: bool) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=directory,
            tokenizer=directory,
            served_model_name=self.model_name,
            dtype=self.dtype,
            seed=seed,
            max_model_len=self.max_context,
            gpu_memory_utilization=memory,
            enable_sleep_mode=True,
            enable_prefix_caching=True,
            enforce_eager=enforce_eager,
            logprobs_mode="raw_logprobs",
            max_logprobs=MAX_TOP_LOGPROBS,
            generation_config="vllm",
            worker_extension_cls=WORKER_EXTENSION,
            disable_log_stats=True,
            **(
                {"enable_lora": True, "max_loras": self._max_loras, "max_lora_rank": self._max_lora_rank}
                if self._max_loras
                else {}
            ),
        )
        return AsyncLLM.from_engine_args(args)

    def _call(self, work: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``work`` on the engine loop from another thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout)

    # -- the engine protocol ---------------------------------------------------------------------------
    def check_prompt(self, prompt_ids: list[int]) -> None:
        """Raise :class:`ContextLengthError` unless the prompt leaves room for one completion token."""
        check_prompt_fits(prompt_ids, self.max_context)

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, on_token: TokenCallback | None = None
    ) -> list[Completion]:
        """Sample ``params.n`` completions for one prompt (continuously batched with other requests).

        ``on_token`` is called from the engine's thread with each token as vLLM returns it. Cancelling
        the awaiting task aborts the request in vLLM (its rows stop at the next scheduler step).

        Raises:
            ContextLengthError: the prompt leaves no room for a completion token.
            RuntimeError: the engine is closed.
        """
        self.check_prompt(prompt_ids)
        if self._closed:
            raise RuntimeError("engine is closed")
        work = self._generate(list(prompt_ids), params, on_token)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    async def score(self, token_ids: list[int], start: int) -> list[float]:
        """`Engine.score` with vLLM's prompt logprobs (``prompt_logprobs=0``: each prompt position's own
        token, raw logprobs) of a one-token request; the sampled token is discarded. The sequence must
        leave room for that token (``len(token_ids) < max_context``).

        Raises:
            RequestError: see `swarm.engine.limits.check_score_input`.
            RuntimeError: the engine is closed.
        """
        check_score_input(token_ids, start, self.max_context - 1, self._vocab_size)
        if self._closed:
            raise RuntimeError("engine is closed")
        work = self._score(list(token_ids), start)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    async def _score(self, token_ids: list[int], start: int) -> list[float]:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        await self._open.wait()
        self._inflight += 1
        try:
            sampling = VllmSamplingParams(
                n=1,
                max_tokens=1,
                prompt_logprobs=0,
                detokenize=False,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            request_id = f"swarm-score-{next(self._ids)}"
            final: Any = None
            async for output in self._llm.generate(
                TokensPrompt(prompt_token_ids=token_ids), sampling, request_id
            ):
                final = output
            per_position = final.prompt_logprobs  # [None, {id: Logprob}, ...], one per prompt position
            return [float(per_position[i][token_ids[i]].logprob) for i in range(start, len(token_ids))]
        finally:
            self._inflight -= 1
            async with self._idle:
                self._idle.notify_all()

    def trainable_module(self) -> torch.nn.Module:
        """A Hugging Face copy of the served weights on the trainer's device (loaded on first use)."""
        if self._trainable is None:
            with self._gpu.hold("trainer copy load"):  # takes GPU memory: not during another's profiling
                module, _ = load_model(self.source, dtype=self.dtype, device=self.device)
            self._trainable = module
        return self._trainable

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Hold new requests back and wait for those in flight to end (re-entrant; the trainer holds it
        during a step). Requests that arrive meanwhile wait and are sampled once it exits."""
        with self._pause_lock:
            self._pause_depth += 1
            try:
                if self._pause_depth == 1:
                    self._call(self._close_gate())
                yield
            finally:
                self._pause_depth -= 1
                if self._pause_depth == 0:
                    self._call(self._open_gate())

    def release_memory(self) -> None:
        """Put vLLM to sleep (level 1: KV cache discarded, weights moved to CPU memory).

        Takes the GPU lock (`swarm.engine.gpu_lock`, waiting while another server on this GPU starts or
        steps) and keeps it until `restore_memory`, which must run in the same thread: while the memory
        is lent to the trainer, no other vLLM server on the GPU measures it.

        Raises:
            GpuLockTimeout: another server held the GPU lock for over `gpu_lock.DEFAULT_TIMEOUT_S`.
        """
        if not self._sleeping:
            self._gpu.acquire("step")
            self._sleep_hold = True
            try:
                self._call(self._llm.sleep(level=1))
            except BaseException:
                self._end_sleep_hold()
                raise
            self._sleeping = True

    def restore_memory(self) -> None:
        """Wake vLLM up (weights back on the GPU, KV cache re-allocated), then drop the GPU lock that
        `release_memory` took (also when waking fails)."""
        if self._sleeping:
            with self._gpu.hold(
                "wake"
            ):  # nested in the sleep window's hold (or anew, retrying a failed wake)
                try:
                    self._call(self._llm.wake_up())
                    self._sleeping = False
                finally:
                    self._end_sleep_hold()

    def load_weights(self, module: torch.nn.Module, policy_version: int) -> None:
        """Serve ``module``'s weights from now on (LoRA merged) and record ``policy_version``.

        The tensors are shared with vLLM's worker through CUDA IPC handles (no copy through the host),
        then the prefix cache is reset: cached prompts were computed with the old weights.
        """
        from torch.multiprocessing.reductions import reduce_tensor

        keep = [(name, t if t.is_cuda else t.cuda()) for name, t in served_weights(module)]
        payload = pickle.dumps([(name, reduce_tensor(t)[1]) for name, t in keep])
        torch.cuda.synchronize()
        self._push("swarm_load_ipc_weights", payload, policy_version)
        del keep

    def load_weight_buckets(
        self, items: list[tuple[Any, Any]], policy_version: int
    ) -> list[tuple[float, float]]:
        """Serve weights sent as flat buckets (`swarm.train.weight_buckets`) by another process on this
        GPU, as ``policy_version``: verl's direct weight path, no module on this side.

        Args:
            items: ``(Bucket, rebuild args)`` per bucket: ``reduce_tensor(flat)[1]`` of the sender's CUDA
                buffer, which the sender keeps alive until this returns.

        Returns:
            Each bucket's fingerprint as vLLM's worker read it (the sender compares them with its own).
        """
        results = self._push("swarm_load_ipc_buckets", pickle.dumps(items), policy_version)
        prints: list[tuple[float, float]] = results[0]  # one worker per engine (no tensor parallelism)
        return prints

    def weight_sync_devices(self) -> list[Any]:
        """Where each of vLLM's workers runs (`swarm.train.weight_transport.DeviceIdentity`), for verl's
        direct path to choose CUDA IPC (the actor's GPU) or a broadcast group (other GPUs or nodes)."""
        from swarm.train.weight_transport import DeviceIdentity

        return [DeviceIdentity(**d) for d in self._call(self._llm.collective_rpc("swarm_device_identity"))]

    def join_weight_group(self, address: Any, rank_offset: int) -> None:
        """Every worker joins the broadcast group of verl's actor rank 0 (`GroupAddress`), worker ``i`` as
        rank ``rank_offset + i``; returns once the group has formed (the actor joins at the same time).

        Raises:
            WeightSyncError: (from the worker) the group did not form within ``address.timeout_s``.
        """
        self._call(
            self._llm.collective_rpc("swarm_join_weight_group", args=(pickle.dumps((address, rank_offset)),))
        )

    def receive_weight_buckets(self, buckets: list[Any], policy_version: int) -> list[tuple[float, float]]:
        """Serve weights broadcast in buckets by verl's actor rank 0 over the group of `join_weight_group`
        (while this runs, the actor broadcasts them), as ``policy_version``.

        Args:
            buckets: The layouts (`swarm.train.weight_buckets.Bucket`), in the order they are broadcast.

        Returns:
            Each bucket's fingerprint as vLLM's worker received it (the sender compares them with its own).
        """
        results = self._push("swarm_receive_broadcast_buckets", pickle.dumps(buckets), policy_version)
        prints: list[tuple[float, float]] = results[0]  # one worker per engine (no tensor parallelism)
        return prints

    def _push(self, method: str, payload: bytes, policy_version: int) -> list[Any]:
        """Wake the weights if asleep, call the worker extension's ``method`` with ``payload``, reset the
        prefix cache (cached prompts were computed with the old weights), wake the KV cache, record
        ``policy_version``; returns each worker's result.

        Copying weights in moves no device memory (the trainer's buffers are mapped, not copied), so an
        awake engine pushes without the GPU lock; a sleeping one wakes under it and drops the sleep
        window's hold."""
        waking = self._gpu.hold("weight load") if self._sleeping else contextlib.nullcontext()
        with waking:
            if self._sleeping:  # level-1 sleep restores its CPU copy on wake: wake the weights first
                self._call(self._llm.wake_up(tags=["weights"]))
            results: list[Any] = self._call(self._llm.collective_rpc(method, args=(payload,)))
            self._call(self._llm.reset_prefix_cache())
            if self._sleeping:
                self._call(self._llm.wake_up(tags=["kv_cache"]))
                self._sleeping = False
                self._end_sleep_hold()
        self.policy_version = policy_version
        return results

    def serve_adapter(self, name: str, module: torch.nn.Module, policy_version: int) -> None:
        """Hot-load adapter ``name`` of the peft model ``module`` (the trainer's copy) as
        ``policy_version``: written to a folder, added under a fresh LoRA id and a fresh LoRA name
        (``name@version#id``), the previous one removed. Requests already running finish with the adapter
        they started with.

        The name must change with the version: vLLM 0.25 compares and hashes ``LoRARequest`` by
        ``lora_name`` alone and keys prefix-cache blocks by it (``kv_cache_utils._gen_lora_extra_hash_keys``),
        so a new version under the old name reused the old version's cached prompt blocks (measured on
        the H200: logprobs up to 0.9 off the new adapter's forward on a repeated prompt)."""
        from vllm.lora.request import LoRARequest

        from swarm.train.adapters import NamedAdapter

        if self._lora_dir is None:
            raise RuntimeError("this vLLM engine was started without LoRA (max_loras=0)")
        folder = self._lora_dir / f"{name}-{policy_version:06d}"
        NamedAdapter(module, name).save_pretrained(folder)
        lora_id = next(self._lora_ids)
        request = LoRARequest(
            lora_name=f"{name}@{policy_version}#{lora_id}", lora_int_id=lora_id, lora_path=str(folder)
        )
        self._call(self._llm.add_lora(request))
        old = self._loras.get(name)
        self._loras[name] = (request, policy_version)
        if old is not None:
            self._call(self._llm.remove_lora(old[0].lora_int_id))
            shutil.rmtree(old[0].lora_path, ignore_errors=True)

    def training_alongside(self) -> contextlib.AbstractContextManager[None]:
        """Nothing: vLLM samples on its GPU while the trainer trains its own copy."""
        return contextlib.nullcontext()

    def drop_adapter(self, name: str) -> None:
        """Stop serving adapter ``name`` (its LoRA id removed from vLLM)."""
        old = self._loras.pop(name, None)
        if old is not None:
            self._call(self._llm.remove_lora(old[0].lora_int_id))
            shutil.rmtree(old[0].lora_path, ignore_errors=True)

    def close(self) -> None:
        """Shut vLLM's engine-core process down and stop the engine thread.

        ``AsyncLLM.shutdown`` runs on the engine loop, where its output handler lives. Whatever it leaves
        alive (it failed, or timed out) is ended by `end_engine_core_processes`: an engine core that
        outlives its server keeps its share of the GPU (``--gpu-memory-utilization``, 42 GiB of an H200 at
        0.3) and the next server on that GPU cannot start.

        Freeing that share happens under the GPU lock (`swarm.engine.gpu_lock`), so it never lands inside
        another server's start-up profiling; a close that cannot get the lock within `STOP_TIMEOUT_S`
        (another server's long start, or this server's own step still running) stops without it.
        """
        if self._closed:
            return
        self._closed = True
        stopping = contextlib.ExitStack()
        try:
            stopping.enter_context(self._gpu.hold("stop", timeout_s=STOP_TIMEOUT_S))
        except GpuLockTimeout as exc:
            log.warning("stopping vLLM without the GPU lock: %s", exc)
        with stopping:
            try:
                self._call(self._shutdown(), timeout=60)
            except Exception as exc:  # the backstop below still ends the process
                log.warning("vLLM shutdown failed (%s); ending its engine core directly", _first_line(exc))
            self._stop_loop()
            ended = end_engine_core_processes(timeout_s=10)
            if ended:
                log.warning(
                    "ended %d vLLM engine-core process(es) that outlived shutdown: %s", len(ended), ended
                )
            if self._gpu.held:
                self._end_sleep_hold()  # closed inside its own sleep window (a failed step)

    # -- internals -------------------------------------------------------------------------------------
    def _end_sleep_hold(self) -> None:
        """Drop the GPU lock's hold of the sleep window, if this engine has one."""
        if self._sleep_hold:
            self._sleep_hold = False
            self._gpu.release()

    async def _shutdown(self) -> None:
        self._llm.shutdown()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    async def _close_gate(self) -> None:
        self._open.clear()
        async with self._idle:
            await self._idle.wait_for(lambda: self._inflight == 0)

    async def _open_gate(self) -> None:
        self._open.set()

    async def _generate(
        self, prompt_ids: list[int], params: SamplingParams, on_token: TokenCallback | None
    ) -> list[Completion]:
        await self._open.wait()
        self._inflight += 1
        try:
            started = time.perf_counter()
            lora = None if params.adapter is None else self._loras.get(params.adapter)
            if params.adapter is not None and lora is None:
                raise RuntimeError(f"adapter {params.adapter!r} is not served")
            version = self.policy_version if lora is None else lora[1]
            max_new = max_new_tokens(params.max_tokens, len(prompt_ids), self.max_context)
            request = None if lora is None else lora[0]
            rows = [
                self._sample(prompt_ids, params, choice, max_new, on_token, request)
                for choice in range(params.n)
            ]
            completions = list(await asyncio.gather(*rows))
            elapsed = time.perf_counter() - started
            for completion in completions:
                completion.generate_s = elapsed
                completion.policy_version = version
            return completions
        finally:
            self._inflight -= 1
            async with self._idle:
                self._idle.notify_all()

    async def _sample(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        choice: int,
        max_new: int,
        on_token: TokenCallback | None,
        lora: Any = None,
    ) -> Completion:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        k = min(params.top_logprobs, MAX_TOP_LOGPROBS)
        sampling = VllmSamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=max_new,
            seed=None if params.seed is None else params.seed + choice,
            stop=list(params.stop) or None,
            stop_token_ids=sorted(self.stop_ids),
            logprobs=k,
            skip_special_tokens=False,
            # vLLM's frontend decodes every sampled token (and every logprob's token) in this process
            # unless told not to; the server detokenizes itself, so only stop strings need it.
            detokenize=bool(params.stop),
            # Token by token only for a listener: a final-only request costs this process one message
            # instead of one per token (the server's loop shares the GIL with this thread).
            output_kind=RequestOutputKind.DELTA if on_token is not None else RequestOutputKind.FINAL_ONLY,
            # Logprobs kept in a few flat lists instead of a dict of `Logprob` objects per token: vLLM's
            # frontend appends every step's token of every request in this process (sharing the GIL with
            # the server's loop); indexing a position gives the same dict as before.
            flat_logprobs=True,
        )
        ids: list[int] = []
        logprobs: list[float] = []
        top: list[list[tuple[int, float]]] = []
        finish: str | None = None
        request_id = f"swarm-{next(self._ids)}"
        stream = self._llm.generate(
            TokensPrompt(prompt_token_ids=prompt_ids), sampling, request_id, lora_request=lora
        )
        async for output in stream:
            piece = output.outputs[0]
            new_ids = list(piece.token_ids)
            per_token = piece.logprobs or []
            for position, token in enumerate(new_ids):
                entry = per_token[position]
                ids.append(token)
                logprobs.append(float(entry[token].logprob))
                if k > 0:
                    ranked = sorted(
                        ((int(t), lp) for t, lp in entry.items() if lp.rank is not None and lp.rank <= k),
                        key=lambda item: item[1].rank or 0,
                    )
                    top.append([(t, float(lp.logprob)) for t, lp in ranked][:k])
                if on_token is not None:
                    last = piece.finish_reason is not None and position == len(new_ids) - 1
                    on_token = _announce(on_token, choice, ids, logprobs, top, last)
            finish = piece.finish_reason or finish
        reason = FinishReason.STOP if finish == "stop" else FinishReason.LENGTH
        return Completion(
            ids=ids,
            logprobs=logprobs,
            finish_reason=reason,
            text=self._visible_text(ids, params.stop),
            top_logprobs=top,
            batch_size=1,
        )

    def _visible_text(self, ids: list[int], stops: tuple[str, ...]) -> str:
        """Decoded text without a final end-of-turn token, cut before the first stop string (as hf)."""
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        text = str(self.tokenizer.decode(ids, skip_special_tokens=False))
        cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
        return text[:cut] if cut >= 0 else text


def _announce(
    on_token: TokenCallback,
    choice: int,
    ids: list[int],
    logprobs: list[float],
    top: list[list[tuple[int, float]]],
    last: bool,
) -> TokenCallback | None:
    """Hand the newest token to a listener; a listener that fails (its loop closed) is dropped."""
    token = SampledToken(
        choice=choice, id=ids[-1], logprob=logprobs[-1], top_logprobs=tuple(top[-1]) if top else (), last=last
    )
    try:
        on_token(token)
    except Exception:
        return None
    return on_token


def _check_can_serve(config: Any, memory: float) -> None:
    """Refuse, in one line, what vLLM would fail on deep inside its engine-core process: a model
    architecture it has no implementation for, and a memory fraction outside (0, 1].

    Raises:
        ModelLoadError: either problem, naming the option to change.
    """
    from vllm import ModelRegistry

    architectures = list(getattr(config, "architectures", None) or [])
    supported = ModelRegistry.get_supported_archs()
    if not any(arch in supported for arch in architectures):
        raise ModelLoadError(
            f"vLLM cannot serve this model (architectures {architectures or 'unknown'}); use --engine hf"
        )
    if not 0 < memory <= 1:
        raise ModelLoadError(f"--gpu-memory-utilization must be in (0, 1], got {memory}")


def _check_free_memory(memory: float) -> None:
    """Refuse, in one line, a memory fraction the GPU cannot give now (called under the GPU lock, where
    no other server's start or step moves the GPU's free memory).

    Raises:
        ModelLoadError: naming the fraction asked for and the memory free.
    """
    free, total = torch.cuda.mem_get_info()
    if memory * total > free:
        raise ModelLoadError(
            f"--gpu-memory-utilization {memory} asks for {memory * total / 2**30:.1f} GiB of the GPU, "
            f"but only {free / 2**30:.1f} GiB is free"
        )


def end_engine_core_processes(timeout_s: float, prefix: str = ENGINE_CORE_PROCESS) -> list[int]:
    """End this process's multiprocessing children named ``prefix`` (vLLM names its engine-core process
    ``EngineCore``, or ``EngineCore_DP<i>`` under data parallelism): SIGTERM, up to ``timeout_s`` seconds
    for them to exit, then SIGKILL. Other children are left alone.

    Returns:
        The pids that were still alive and were ended (empty when shutdown had already ended them).
    """
    children = [p for p in multiprocessing.active_children() if p.name.startswith(prefix)]
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            child.terminate()
    deadline = time.monotonic() + timeout_s
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
    for child in children:
        if child.is_alive():
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            child.join(5)
    return [child.pid for child in children if child.pid is not None]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


__all__ = [
    "EngineUnavailable",
    "VLLMEngine",
    "check_vllm_available",
    "end_engine_core_processes",
    "served_weights",
]
