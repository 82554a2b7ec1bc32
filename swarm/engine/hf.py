"""The ``hf`` engine: batched sampling with a transformers causal LM (the embedded default).

Concurrent requests are queued and a worker thread runs them together as one static batch: prompts are
left-padded, position ids are computed from the attention mask so every row sees the positions it
would see alone, and one decode loop with a shared KV cache samples every row with its own
temperature, top-p, seed and stop conditions. Static batching beats continuous batching for a small
model on a CPU (docs/ARCHITECTURE.md §The hf engine), and it keeps logprobs exact: they are
``log_softmax`` of the fp32 raw logits (never HF ``scores``, which are after logits processors). With
``mixed_precision`` (bf16 autocast, :mod:`swarm.precision`) the logits carry bf16 rounding;
log-softmax is still float32.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from swarm.engine.adapter_twin import copy_adapter, drop_twin_adapter, sampling_twin
from swarm.engine.base import Completion, SampledToken, SamplingParams, TokenCallback
from swarm.engine.limits import check_prompt_fits, check_score_input, end_of_turn_ids, max_new_tokens
from swarm.engine.lora_rows import adapter_rows, spans_of, supports_adapter_rows
from swarm.engine.priority_lock import PriorityLock
from swarm.heap import return_freed_memory
from swarm.precision import MixedPrecision, autocast, require_resolved
from swarm.tracking.records import FinishReason


@dataclass
class _Job:
    prompt_ids: list[int]
    params: SamplingParams
    on_token: TokenCallback | None = None
    future: concurrent.futures.Future[list[Completion]] = field(default_factory=concurrent.futures.Future)
    announced: bool = False
    """Whether a token of it was handed to ``on_token`` (it cannot be sampled again unseen)."""


@dataclass
class _Row:
    """One completion being sampled (a request with ``n`` choices has ``n`` rows)."""

    job: _Job
    choice: int
    generator: torch.Generator | None
    max_new: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: FinishReason | None = None
    text: str | None = None
    """Visible text, set when a stop string cut it (else decoded at the end)."""


class HFEngine:
    """Batched sampler over a transformers model; thread-safe; generation pauses while ``lock`` is held.

    Implements `swarm.engine.base.Engine`. Its logprobs follow that protocol's convention (float32
    ``log_softmax`` of the raw logits: temperature 1, before top-p).

    Args:
        model: a causal LM (``PreTrainedModel`` or a peft wrapper); :meth:`load_weights` replaces it.
        tokenizer: its tokenizer (used for stop strings and end-of-turn ids only).
        model_name: served name.
        max_batch_size: most rows (requests × n) per batch.
        batch_window_s: how long the worker waits for more requests after the first arrives.
        regroup_fraction: after a batch ends, the next one waits (beyond ``batch_window_s``) for as
            many rows as the ended batch had plus those left queued, for at most this fraction of the
            ended batch's duration. Clients that send their next request when their answer arrives
            then share one batch again instead of splitting into batches that take turns. A lower
            count replaces the expected one only when two batches in a row see it (a barrier where
            some clients wait for the others does not split the next batch).
        regroup_max_s: cap in seconds on that extra wait.
        mixed_precision: compute dtype of forward passes (:mod:`swarm.precision`); ``NO`` keeps logprobs
            float32-exact. Must be resolved (not ``AUTO``).
        sample_while_training: LoRA tenants: sample every adapter on a sampling twin of the trainer's
            peft model (`swarm.engine.adapter_twin`: the same base weights, its own adapter tensors), so
            the other tenants keep sampling during a tenant's step (:attr:`samples_while_training`).
            ``False``: the engine samples the trained module and a step pauses it.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        model_name: str,
        *,
        max_batch_size: int = 32,
        batch_window_s: float = 0.005,
        regroup_fraction: float = 0.2,
        regroup_max_s: float = 2.0,
        mixed_precision: MixedPrecision = MixedPrecision.NO,
        sample_while_training: bool = False,
    ) -> None:
        require_resolved(mixed_precision)
        self.model = model
        self.mixed_precision = mixed_precision
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_batch_size = max_batch_size
        self.batch_window_s = batch_window_s
        self.regroup_fraction = regroup_fraction
        self.regroup_max_s = regroup_max_s
        config = model.config
        self.max_context = int(getattr(config, "max_position_embeddings", 2048))
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.stop_ids = end_of_turn_ids((getattr(model, "generation_config", None), model.config), tokenizer)
        self.lock = PriorityLock()
        """Held by a batch (the worker: `PriorityLock.after_first`) and by :meth:`pause` (`PriorityLock.first`)."""
        self.policy_version = 0
        """Trainer step of the weights being sampled (set by :meth:`load_weights`, with the weights)."""
        self.samples_while_training = sample_while_training
        """Tenants: ``False``, a tenant's step updates the served module, so sampling waits for it
        (`pause`); ``True``, the engine samples its own twin (:meth:`serve_adapter`) meanwhile."""
        self._threads = torch.get_num_threads()
        """Torch threads of the worker (and of a step's thread) when it runs alone (the constructing
        thread's count: `ServerConfig.torch_threads` or torch's default)."""
        self._threads_now = self._threads
        """The worker's torch threads for its next forward (:meth:`training_alongside` halves them)."""
        self._twin: nn.Module | None = None
        """The sampling twin of the tenants' peft model (``sample_while_training``; built by the first
        :meth:`serve_adapter`)."""
        self.adapters: dict[str, int] = {}
        """LoRA adapters served by name (tenants, :meth:`serve_adapter`) → their policy version. While
        any is served every batch passes peft's per-row ``adapter_names`` (``__base__`` for a row without
        one), so rows of different adapters share one forward pass."""
        forward_params = inspect.signature(model.forward).parameters
        # transformers >= 5.2x renamed ``past_key_values`` to ``cache``; accept both.
        self._cache_kw = "cache" if "cache" in forward_params else "past_key_values"
        self._logits_kw = "logits_to_keep" if "logits_to_keep" in forward_params else None
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._queued_rows = 0
        self._submitted_rows = 0  # ever submitted (under `_queued_lock`)
        self._first_answer_mark: int | None = None
        """`_submitted_rows` when the running batch returned its first answer (see `_run`)."""
        self._queued_lock = threading.Lock()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="hf-engine", daemon=True)
        self._worker.start()
        self.batches = 0
        """Number of batches run (for tests and metrics)."""
        self.trims = 0
        """Times the heap was handed back (for tests)."""
        self.idle_trim_s = 1.0
        """After a CPU batch, once the queue has been empty this long the freed heap is handed back
        to the OS (`swarm.heap`)."""

    def _on_cpu(self) -> bool:
        return bool(next(self.model.parameters()).device.type == "cpu")

    # -- public API -----------------------------------------------------------------------------------
    def check_prompt(self, prompt_ids: list[int]) -> None:
        """Raise :class:`ContextLengthError` unless the prompt leaves room for one completion token."""
        check_prompt_fits(prompt_ids, self.max_context)

    # -- training hooks (`Engine`) --------------------------------------------------------------------
    def trainable_module(self) -> nn.Module:
        """The served module itself: the trainer updates the weights this engine samples with."""
        module: nn.Module = self.model
        return module

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Hold :attr:`lock`: the running batch ends first, queued requests wait until the exit. Fair: while
        a caller waits here the worker starts no new batch, so it waits for one batch at most (a plain lock
        let the worker take it back batch after batch: a tenant's create waited 54 s under load)."""
        with self.lock.first():
            yield

    def release_memory(self) -> None:
        """Nothing to release: the trainer shares the served weights and a batch's cache is freed."""

    def restore_memory(self) -> None:
        """Nothing to restore (see :meth:`release_memory`)."""

    def load_weights(self, module: nn.Module, policy_version: int) -> None:
        """Sample with ``module`` (the trainer's sampling module, sharing or merging its weights) as
        ``policy_version`` from the next batch on."""
        with self.lock:
            self.model = module
            self.policy_version = policy_version

    def serve_adapter(self, name: str, module: nn.Module, policy_version: int) -> None:
        """Sample requests naming adapter ``name`` (`SamplingParams.adapter`) with that adapter of
        ``module`` (the peft model holding every tenant's adapter, which shares the base weights) as
        ``policy_version``, from the next batch on. ``module`` replaces the served module; with
        ``sample_while_training`` the engine serves its twin of it instead and copies adapter ``name``'s
        tensors into the twin (`swarm.engine.adapter_twin`), under :attr:`lock`: between batches."""
        with self.lock:
            if not self.samples_while_training:
                self.model = module
            elif self._twin is None:
                self._twin = self.model = sampling_twin(module)
            else:
                copy_adapter(module, self._twin, name)
            self.adapters[name] = policy_version

    @contextlib.contextmanager
    def training_alongside(self) -> Iterator[None]:
        """A tenant's step runs in the calling thread while the worker samples (``sample_while_training``):
        on a CPU the worker's forwards use half the torch threads (at least one) until the exit, the step
        keeps all of them (tenants' steps queue on one trainer, so a step is the stage's critical path).
        ``torch.set_num_threads`` sets the calling OS thread's OpenMP team size (and the default of
        threads started later), so the worker applies its share itself before each forward
        (:meth:`_last_logits`). bench/README.md (``tenants.py``) has the measurements."""
        if not self._on_cpu():
            yield
            return
        self._threads_now = max(1, self._threads // 2)
        try:
            yield
        finally:
            self._threads_now = self._threads

    def drop_adapter(self, name: str) -> None:
        """Stop serving adapter ``name`` (a request still naming it fails)."""
        with self.lock:
            self.adapters.pop(name, None)
            if self._twin is not None:
                drop_twin_adapter(self._twin, name)

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, on_token: TokenCallback | None = None
    ) -> concurrent.futures.Future[list[Completion]]:
        """Queue a request; the future resolves to ``params.n`` completions.

        ``on_token`` is called on the worker thread with every token as it is sampled; an exception it
        raises stops the calls (the completion is still sampled and returned). Cancelling the future
        stops the request's rows at the next decode step (or before its batch starts); cancelling the
        task awaiting :meth:`generate` does the same.
        """
        self.check_prompt(prompt_ids)
        if self._closed:
            raise RuntimeError("engine is closed")
        job = _Job(list(prompt_ids), params, on_token)
        with self._queued_lock:
            self._queued_rows += params.n
            self._submitted_rows += params.n
        self._queue.put(job)
        return job.future

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, on_token: TokenCallback | None = None
    ) -> list[Completion]:
        """Sample ``params.n`` completions (awaitable; batched with concurrent requests)."""
        return await asyncio.wrap_future(self.submit(prompt_ids, params, on_token))

    def generate_sync(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        """Blocking variant of :meth:`generate`."""
        return self.submit(prompt_ids, params).result()

    async def score(self, token_ids: list[int], start: int) -> list[float]:
        """`Engine.score`: one no-grad forward of ``token_ids`` (in a worker thread, under :attr:`lock`, so
        it never overlaps a batch or a weight update); float32 ``log_softmax`` of the raw logits."""
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        check_score_input(token_ids, start, self.max_context, vocab)
        return await asyncio.to_thread(self._score, list(token_ids), start)

    @torch.no_grad()
    def _score(self, token_ids: list[int], start: int) -> list[float]:
        with self.lock:
            device = next(self.model.parameters()).device
            ids = torch.tensor([token_ids], dtype=torch.long, device=device)  # (1, T)
            with autocast(device, self.mixed_precision):
                logits = self.model(input_ids=ids, use_cache=False).logits  # (1, T, V)
            # logits at position i-1 predict token i: rows start-1 .. T-2 score tokens start .. T-1
            logprobs_PV = torch.log_softmax(logits[0, start - 1 : -1].float(), dim=-1)  # (P, V)
            picked = logprobs_PV.gather(1, ids[0, start:, None])[:, 0]  # (P,)
            return [float(x) for x in picked.cpu()]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._worker.join(timeout=30)

    # -- worker ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        expected_rows = 0  # rows of the last batch + rows queued when it ended: likely back soon
        lowered = False  # the last batch saw fewer rows than expected (the next such one lowers it)
        regroup_until = 0.0  # monotonic time until which the worker waits for them
        untrimmed = False  # a CPU batch ran since the heap was last handed back
        while True:
            try:
                first = self._queue.get(timeout=self.idle_trim_s if untrimmed else None)
            except queue.Empty:  # idle: give the batch's freed activations back to the OS
                self.trims += return_freed_memory()
                untrimmed = False
                continue
            if first is None:
                return
            jobs = [first]
            rows = first.params.n
            window_end = time.monotonic() + self.batch_window_s
            target = min(expected_rows, self.max_batch_size)
            while rows < self.max_batch_size:
                deadline = max(window_end, regroup_until) if rows < target else window_end
                timeout = deadline - time.monotonic()
                try:
                    job = (
                        self._queue.get(timeout=max(timeout, 0.0))
                        if timeout > 0
                        else self._queue.get_nowait()
                    )
                except queue.Empty:
                    break
                if job is None:
                    self._queue.put(None)
                    break
                jobs.append(job)
                rows += job.params.n
            with self._queued_lock:
                self._queued_rows -= rows
            try:
                with self.lock.after_first():  # a training step may hold it a while: see cancellations after
                    jobs = [job for job in jobs if not job.future.cancelled()]  # callers that stopped waiting
                    if not jobs:
                        continue
                    started = time.monotonic()
                    self._first_answer_mark = None
                    self._generate_isolated(jobs)  # resolves each job's future as soon as its rows end
                    ended = time.monotonic()
                untrimmed = self._on_cpu()
                with self._queued_lock:
                    # Rows queued since this batch returned its first answer may be its own clients
                    # coming back (already counted in `rows`): count at most that many once.
                    mark = self._first_answer_mark
                    returning = 0 if mark is None else min(rows, self._submitted_rows - mark)
                    observed = rows + self._queued_rows - returning
                if observed >= expected_rows or lowered:
                    expected_rows, lowered = observed, False
                else:
                    lowered = True
                regroup_until = ended + min(self.regroup_max_s, self.regroup_fraction * (ended - started))
            except BaseException as exc:  # hand the failure to every waiting request
                for job in jobs:
                    self._fail(job, exc)

    def _generate_isolated(self, jobs: list[_Job]) -> None:
        """:meth:`_generate_batch`, with an engine error confined to the request that causes it.

        When a batch of several requests fails, each request it left unanswered runs again alone and only
        one that fails alone gets the error: a bad request (a token id beyond the vocabulary, a row that
        runs out of memory) fails by itself instead of failing every client batched with it. A request
        whose first tokens were already streamed (``on_token``) cannot be sampled again unseen, so it gets
        the batch's error. Errors that are not ``Exception`` (interrupts) fail every request.
        """
        try:
            self._generate_batch(jobs)
            return
        except Exception as exc:
            if len(jobs) == 1:
                raise
            failure = exc
        for job in [job for job in jobs if not job.future.done()]:
            if job.announced:
                self._fail(job, failure)
                continue
            try:
                self._generate_batch([job])
            except Exception as alone:
                self._fail(job, alone)

    @staticmethod
    def _fail(job: _Job, exc: BaseException) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled meanwhile
            job.future.set_exception(exc)

    def _make_rows(self, jobs: list[_Job]) -> list[_Row]:
        rows: list[_Row] = []
        for job in jobs:
            max_new = max_new_tokens(job.params.max_tokens, len(job.prompt_ids), self.max_context)
            for choice in range(job.params.n):
                rows.append(_Row(job, choice, None, max_new=max_new))
        return rows

    @torch.no_grad()
    def _generate_batch(self, jobs: list[_Job]) -> None:
        """Sample every row of ``jobs`` in one static batch. A job's future is resolved as soon as all of
        its rows have ended, not when the batch ends: a short answer batched with a long one returns at
        once (its next request then waits for the batch, since rows never join a running batch)."""
        started = time.perf_counter()
        rows = self._make_rows(jobs)
        if self.adapters:  # each adapter's rows adjacent (`_adapter_batch`)
            rows.sort(key=lambda r: (r.job.params.adapter is not None, r.job.params.adapter or ""))
        pending = {id(job): job for job in jobs}
        device = next(self.model.parameters()).device
        B = len(rows)
        L = max(len(r.job.prompt_ids) for r in rows)
        input_ids_BL = torch.full((B, L), self.pad_id, dtype=torch.long)
        attention_BL = torch.zeros((B, L), dtype=torch.long)
        for b, row in enumerate(rows):  # left padding
            p = row.job.prompt_ids
            input_ids_BL[b, L - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention_BL[b, L - len(p) :] = 1
        input_ids_BL, attention_BL = input_ids_BL.to(device), attention_BL.to(device)
        position_BL = (attention_BL.cumsum(-1) - 1).clamp(min=0)
        temperature_B = torch.tensor(
            [r.job.params.temperature for r in rows], dtype=torch.float32, device=device
        )
        top_p_B = torch.tensor([r.job.params.top_p for r in rows], dtype=torch.float32, device=device)
        top_k = max(r.job.params.top_logprobs for r in rows)
        for row in rows:
            if row.job.params.seed is not None:  # per-row generator on the model's device
                row.generator = torch.Generator(device=device).manual_seed(row.job.params.seed + row.choice)

        from transformers import DynamicCache

        cache = DynamicCache()
        mixed, adapter_kw = self._adapter_batch(rows)
        with mixed:
            prefill_kw: dict[str, Any] = {self._cache_kw: cache, **adapter_kw}
            if self._logits_kw:
                prefill_kw[self._logits_kw] = 1  # only the last position's logits are needed
            logits_BV = self._last_logits(device, input_ids_BL, attention_BL, position_BL, **prefill_kw)
            next_pos_B = position_BL[:, -1:] + 1
            max_new = max(r.max_new for r in rows)
            for _ in range(max_new):
                # Everything stays on the model's device; one transfer of B ids + B logprobs per step.
                logprobs_BV = torch.log_softmax(logits_BV, dim=-1)
                tokens_B = self._sample(logits_BV, temperature_B, top_p_B, rows)
                chosen_B = logprobs_BV.gather(1, tokens_B[:, None])[:, 0]
                tokens, chosen = tokens_B.tolist(), chosen_B.tolist()
                if top_k > 0:
                    top_vals_BK, top_ids_BK = torch.topk(logprobs_BV, top_k, dim=-1)
                    top_vals, top_ids = top_vals_BK.tolist(), top_ids_BK.tolist()
                for b, row in enumerate(rows):
                    if row.finish is not None:
                        continue
                    tok = tokens[b]
                    row.ids.append(tok)
                    row.logprobs.append(chosen[b])
                    k = row.job.params.top_logprobs
                    if k > 0:
                        row.top.append(list(zip(top_ids[b][:k], top_vals[b][:k], strict=True)))
                    self._check_finish(row, tok)
                    if row.job.on_token is not None:
                        self._announce(row)
                for row in rows:  # a cancelled request (its episode ended) stops sampling now
                    if row.finish is None and row.job.future.cancelled():
                        row.finish = FinishReason.LENGTH
                self._resolve_ended(pending, rows, time.perf_counter() - started)
                if not pending:
                    break
                step_ids_B1 = tokens_B.view(B, 1)
                attention_BL = torch.cat(
                    [attention_BL, torch.ones((B, 1), dtype=torch.long, device=device)], dim=1
                )
                logits_BV = self._last_logits(
                    device, step_ids_B1, attention_BL, next_pos_B, **{self._cache_kw: cache}, **adapter_kw
                )
                next_pos_B = next_pos_B + 1
        self.batches += 1
        for row in rows:  # defensive: the loop above always ends every row
            if row.finish is None:
                row.finish = FinishReason.LENGTH
        self._resolve_ended(pending, rows, time.perf_counter() - started)

    def _adapter_batch(
        self, rows: list[_Row]
    ) -> tuple[contextlib.AbstractContextManager[Any], dict[str, Any]]:
        """How a batch applies its rows' LoRA adapters (tenants): a context to sample in and extra forward
        arguments. While any adapter is served, rows of different adapters (sorted: each adapter's rows
        adjacent) share one forward: the base runs once over every row and each adapter's low-rank term is
        added to its rows (`swarm.engine.lora_rows`), or, for LoRA layers that module cannot serve, peft
        applies them (``adapter_names``, ``__base__`` for a row without one). Without adapters: nothing."""
        if not self.adapters:
            return contextlib.nullcontext(), {}
        names = [r.job.params.adapter for r in rows]
        if supports_adapter_rows(self.model):
            return adapter_rows(self.model, spans_of(names)), {}
        return contextlib.nullcontext(), {"adapter_names": [n or "__base__" for n in names]}

    def _resolve_ended(self, pending: dict[int, _Job], rows: list[_Row], elapsed: float) -> None:
        """Resolve (and drop from ``pending``) every job whose rows have all ended."""
        for key, job in list(pending.items()):
            mine = [r for r in rows if r.job is job]
            if any(r.finish is None for r in mine):
                continue
            del pending[key]
            if self._first_answer_mark is None:
                with self._queued_lock:
                    self._first_answer_mark = self._submitted_rows
            completions = []
            for row in mine:
                assert row.finish is not None
                completions.append(
                    Completion(
                        ids=row.ids,
                        logprobs=row.logprobs,
                        finish_reason=row.finish,
                        text=row.text if row.text is not None else self._visible_text(row.ids),
                        top_logprobs=row.top,
                        generate_s=elapsed,
                        batch_size=len(rows),
                        policy_version=self._version_of(job.params.adapter),
                    )
                )
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled meanwhile
                job.future.set_result(completions)

    def _version_of(self, adapter: str | None) -> int:
        """The policy version a row of ``adapter`` samples (its tenant's step; the served policy's)."""
        return self.policy_version if adapter is None else self.adapters.get(adapter, 0)

    @staticmethod
    def _announce(row: _Row) -> None:
        job = row.job
        assert job.on_token is not None
        token = SampledToken(
            choice=row.choice,
            id=row.ids[-1],
            logprob=row.logprobs[-1],
            top_logprobs=tuple(row.top[-1]) if row.top else (),
            last=row.finish is not None,
        )
        job.announced = True
        try:
            job.on_token(token)
        except Exception:  # a listener that fails (its loop closed) must not break the batch
            job.on_token = None

    def _last_logits(
        self, device: Any, input_ids: Any, attention: Any, positions: Any, **kw: Any
    ) -> torch.Tensor:
        """One forward (under the engine's autocast); float32 logits of the last position, shape (B, V)."""
        if self._threads_now != torch.get_num_threads():  # this thread's share (`training_alongside`)
            torch.set_num_threads(self._threads_now)
        with autocast(device, self.mixed_precision):
            out = self.model(
                input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, **kw
            )
        return out.logits[:, -1, :].float()

    def _visible_text(self, ids: list[int]) -> str:
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def _check_finish(self, row: _Row, tok: int) -> None:
        if tok in self.stop_ids:
            row.finish = FinishReason.STOP
            return
        stops = row.job.params.stop
        if stops:
            text = self._visible_text(row.ids)
            cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                row.finish = FinishReason.STOP
                row.text = text[:cut]
                return
        if len(row.ids) >= row.max_new:
            row.finish = FinishReason.LENGTH

    @staticmethod
    def _sample(
        logits_BV: torch.Tensor, temperature_B: torch.Tensor, top_p_B: torch.Tensor, rows: list[_Row]
    ) -> torch.Tensor:
        """Sample one token per row, vectorised: greedy where temperature is 0, else top-p (nucleus,
        Holtzman et al. 2020) over ``softmax(logits / T)``.

        Rows without a seed are drawn together from the device's global generator; seeded rows draw
        from their own generator so a seed reproduces its completion whatever else shares the batch.

        Returns:
            Token ids, shape (B,), int64, on the logits' device.
        """
        greedy_B = logits_BV.argmax(dim=-1)
        # A temperature too small for float32 (1e-300) is 0 there: greedy, like 0.
        positive = (temperature_B > 0).tolist()
        sampled = [b for b, r in enumerate(rows) if r.finish is None and positive[b]]
        if not sampled:
            return greedy_B
        idx_S = torch.tensor(sampled, device=logits_BV.device)
        logits_SV = logits_BV[idx_S]
        # Shift by the max before dividing: a tiny temperature then gives -inf (probability 0) for the
        # other tokens instead of inf - inf = NaN.
        shifted_SV = logits_SV - logits_SV.max(dim=-1, keepdim=True).values
        probs_SV = torch.softmax(shifted_SV / temperature_B[idx_S, None], dim=-1)
        top_p_S = top_p_B[idx_S]
        if bool((top_p_S < 1.0).any()):
            sorted_p_SV, sorted_i_SV = torch.sort(probs_SV, dim=-1, descending=True)
            keep_SV = sorted_p_SV.cumsum(-1) - sorted_p_SV < top_p_S[:, None]  # always keeps the top token
            probs_SV = torch.zeros_like(probs_SV).scatter(-1, sorted_i_SV, sorted_p_SV * keep_SV)
        drawn_S = torch.empty(len(sampled), dtype=torch.long, device=logits_BV.device)
        free = [i for i, b in enumerate(sampled) if rows[b].generator is None]
        if free:
            free_F = torch.tensor(free, device=logits_BV.device)
            drawn_S[free_F] = torch.multinomial(probs_SV[free_F], 1)[:, 0]
        for i, b in enumerate(sampled):
            generator = rows[b].generator
            if generator is not None:
                drawn_S[i] = torch.multinomial(probs_SV[i], 1, generator=generator)[0]
        out_B = greedy_B.clone()
        out_B[idx_S] = drawn_S
        return out_B
