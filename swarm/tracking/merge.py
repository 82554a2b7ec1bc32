"""Prefix merging: an episode's call records → training samples, token-exactly.

**Rule.** Call ``B`` *extends* call ``A`` (``A.index < B.index``) iff ``B.prompt_ids`` starts with
``A.prompt_ids + A.completion_ids`` exactly. The parent of ``B`` is the call it extends with the longest
such sequence (ties: the latest call). Parents form a forest per episode; every root-to-leaf path is a
maximal chain and becomes one :class:`~swarm.tracking.records.Sample` whose ``input_ids`` are the leaf's
``prompt_ids + completion_ids`` (every earlier call on the chain is a prefix of it, so nothing is
re-tokenized or invented). The loss mask is 1 exactly on completion tokens of trainable calls on the
chain; when chains share calls (``n > 1`` choices, retries, edited histories) a shared call is trained
only in the first sample that contains it, so the multiset of trained tokens equals the multiset of
trainable completion tokens. Chains with nothing left to train are dropped.

**Worked example** (compare tinker-cookbook ``rl/data_processing.py``, ``trajectory_to_data``, which
merges only consecutive observations greedily). ``S`` = system + tools, ``U``/``R`` = user/tool turns,
``X`` = completions, agent ``a`` trainable, agent ``b`` not::

    call 0 (a): prompt S U1                     completion X0
    call 1 (b): prompt S' V1                    completion Y1    # sub-agent, own system prompt
    call 2 (a): prompt S U1 X0 R1               completion X2    # extends call 0
    call 3 (a): prompt S U1 X0 R1 X2 U2         completion X3    # extends call 2
    call 4 (a): prompt S U1 X0' R1 X2' U2 X3' U3 completion X4   # the template stripped <think> from
                                                                 #   earlier turns: extends nothing
    forest: 0 → 2 → 3,   1,   4
    sample 0: S U1 X0 R1 X2 U2 X3                 mask on X0 X2 X3, calls [0, 2, 3]
    (chain [1]: nothing trainable, dropped and counted in ``untrained_chains``)
    sample 1: S U1 X0' R1 X2' U2 X3' U3 X4        mask on X4,       calls [4]
    prefix breaks: {"completion_rewritten": 1}   (call 4 against call 3, the latest call of agent a;
                                                  they diverge inside X0, the completion of call 0)

**Text-level merging** (``merge=MergeMode.TEXT``, after the paper's Fig. 5). Templates that rewrite
earlier turns (Qwen3 strips ``<think>`` from assistant turns before the last user message) break every
token chain, so each turn would be its own sample. In text mode a call ``B`` that extends no call by
tokens *text-extends* ``A`` iff ``decode(B.prompt_ids)`` starts with ``decode(A.prompt_ids) + answer``,
where ``answer`` is ``decode(A.completion_ids)`` or its visible part (:func:`visible_answer`: the text
after the last ``</think>``, leading newlines removed, as Qwen3 templates re-render it), and that text
ends at a token boundary ``k`` of ``B.prompt_ids``. ``B`` then joins ``A``'s chain. The sample of a chain
is the *trajectory as sampled*: the first call's prompt, then per call its completion ids exactly as the
engine sampled them (``<think>`` included) and the next call's new prompt tokens ``B.prompt_ids[k:]``
(user/tool turns), so every trained token is a token the engine produced::

    call 0: prompt S U1             completion T0 X0        (T = <think>…</think>, X = the answer)
    call 1: prompt S U1 X0 U2       completion T1 X1        (T0 stripped by the template)
    token mode: samples [S U1 T0 X0], [S U1 X0 U2 T1 X1]
    text mode:  sample  [S U1 T0 X0 U2 T1 X1], loss mask on T0 X0 and T1 X1, calls [0, 1]

Trained tokens and old logprobs in text mode: the loss mask is 1 on every trainable completion token of
the chain, as in token mode; ``behaviour_logprobs`` are the sampler's logprobs of those tokens, taken
under the prompt the call really had (for ``T1 X1``: without ``T0``). The trainer's π_θ_old is computed on
the merged sequence (with ``T0``), so for later turns of a text chain the context of π_θ_old and of the
sampler differ; the step's ``drift`` metric measures it and ``--tis-cap`` weights by π_θ_old/μ. Token mode
never has this mismatch. Every call on a text chain is not a prefix of the sample, so
:func:`call_sequences` applies to token chains only.

**Prefix breaks** are counted per call ``B`` that does not extend ``A``, the latest earlier call of the
same agent (nor another choice of ``A``'s request: a call of that agent with ``A``'s prompt), with the
cause read from the longest common prefix ``l`` of ``B.prompt_ids`` and ``A.prompt_ids +
A.completion_ids`` (see :class:`PrefixBreak`). Calls of another agent in between are not breaks
(``agent_switches`` counts them).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum

from pydantic import BaseModel, Field

from swarm.tracking.errors import MergeError
from swarm.tracking.records import CallRecord, Sample

NEW_CONTEXT_RATIO = 0.5
"""A break is ``new_context`` when the common prefix is shorter than this fraction of the shorter prompt."""


class LossWeighting(StrEnum):
    """How :attr:`Sample.weight` is set. The trainer's contract (the same for every mode)::

        loss = Σ_s weight_s · mean_{t: mask_s[t]=1} ℓ_s[t]  /  Σ_s weight_s

    summed over the samples ``s`` of a batch, where ``ℓ_s[t]`` is the per-token loss (e.g. the PPO/GRPO
    clipped surrogate times -1). Equivalently every masked token gets the coefficient
    ``weight_s / n_s`` (:func:`token_loss_weights`; ``n_s`` = trained tokens of ``s``) and the weighted sum
    is divided by the batch's ``Σ_s weight_s``.

    In terms of :class:`swarm.train.losses.LossAggregation` this contract is ``SEQ_MEAN_TOKEN_MEAN`` with
    ``weights_B = sample.weight``. Under ``TOKEN_MEAN`` (``Σ_i w_i Σ_t ℓ_it / Σ_i w_i |o_i|``) a sample weight
    multiplies each of its tokens instead; there the split-invariant choice is ``SAMPLE`` (all weights 1:
    a split episode's tokens weigh exactly what they would in one merged sequence), or per-token
    coefficients from :func:`token_loss_weights`. Weights only matter for split episodes: an episode that
    merged into one sample has weight 1 in ``EPISODE`` and ``SAMPLE`` modes.
    """

    EPISODE = "episode"
    """Default. ``weight_s = n_s / N_e`` (``N_e`` = trained tokens of the episode), so an episode's weights
    sum to 1 and the loss is the mean over episodes of each episode's token mean. An episode split into
    k samples counts once, and the split is by trained tokens rather than equal (1/k), which makes the
    objective independent of where the tracker had to split: a think-stripping template (k samples) and a
    merging one (1 sample) give the same gradient for the same tokens."""
    SAMPLE = "sample"
    """``weight_s = 1``: each sample counts once (per-sequence mean, as in the original GRPO); an episode
    split into k samples counts k times."""
    TOKEN = "token"
    """``weight_s = n_s``: every trained token in the batch counts equally (token-level mean, as in DAPO /
    Dr. GRPO ``loss_type="token"``), however tokens are distributed over samples and episodes."""


class MergeMode(StrEnum):
    """How calls join chains (``swarm serve --merge``)."""

    TOKEN = "token"
    """Default. ``B`` joins ``A``'s chain only when ``B.prompt_ids`` starts with ``A``'s ids exactly."""
    TEXT = "text"
    """Also when ``B``'s prompt text continues ``A``'s prompt text and answer (module docstring)."""


Decode = Callable[[Sequence[int]], str]
"""Token ids → text with special tokens kept (the tokenizer's ``decode(ids, skip_special_tokens=False)``)."""

THINK_CLOSE = "</think>"


def visible_answer(completion_text: str) -> str:
    """A completion as a think-stripping template re-renders it in later turns: the text after the last
    ``</think>`` with leading newlines removed (Qwen3's rule); unchanged without a ``</think>``."""
    if THINK_CLOSE not in completion_text:
        return completion_text
    return completion_text.split(THINK_CLOSE)[-1].lstrip("\n")


class PrefixBreak(StrEnum):
    """Why call ``B`` does not extend ``A``, the latest earlier call of the same agent (``l`` = common prefix)."""

    RESAMPLED = "resampled"
    """``B.prompt_ids == A.prompt_ids``: another choice (``n > 1``) or a retry of the same request."""
    COMPLETION_REWRITTEN = "completion_rewritten"
    """``l`` ends inside the completion of ``A`` or of a call on ``A``'s chain (or right after ``A``'s
    prompt): an earlier completion was not repeated verbatim (the template stripped ``<think>`` or
    re-formatted a tool call, a stop string was removed, the client edited the reply)."""
    HISTORY_EDITED = "history_edited"
    """``l`` ends elsewhere inside ``A``'s prompt but covers at least half of the shorter prompt: the agent
    dropped, edited or summarised turns of its history."""
    NEW_CONTEXT = "new_context"
    """Little or no common prefix: another system prompt (a sub-agent under the same name), a new task."""


class MergeStats(BaseModel):
    """Merge metrics of one episode, or of a batch (:func:`aggregate_stats`)."""

    episodes: int = 1
    calls: int = 0
    samples: int = 0
    merge_ratio: float = 0.0
    """Calls per sample (``calls / samples``; 0 when there is no sample)."""
    prefix_breaks: dict[str, int] = Field(default_factory=dict)
    """Count per :class:`PrefixBreak` cause."""
    agent_switches: int = 0
    """Consecutive calls (by index) made by different agents (interleaving; not a break)."""
    splices: int = 0
    """Sum of ``CallRecord.splices``: assistant spans reused token-exactly (drift repairs)."""
    splice_mismatches: int = 0
    """Sum of ``CallRecord.splice_mismatches``: repeated completions the template rendered differently."""
    prompt_tokens_total: int = 0
    """Σ ``len(prompt_ids)`` over all calls."""
    completion_tokens_total: int = 0
    """Σ ``len(completion_ids)`` over all calls."""
    tokens_unmerged: int = 0
    """Σ ``len(prompt_ids) + len(completion_ids)`` over trainable calls: tokens forwarded when each call
    is trained as its own sequence."""
    tokens_merged: int = 0
    """Σ ``len(input_ids)`` over the samples: tokens forwarded with merging."""
    tokens_saved: int = 0
    """``tokens_unmerged - tokens_merged``."""
    trained_tokens: int = 0
    """Σ of the loss masks (= trainable completion tokens)."""
    untrained_chains: int = 0
    """Chains dropped because none of their tokens was left to train."""
    token_breaks: int = 0
    """Σ ``prefix_breaks``: calls that extend no call of their agent token-exactly (either mode)."""
    text_merges: int = 0
    """Calls that joined a chain by text only (``MergeMode.TEXT``; always 0 in token mode)."""


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _extends(prompt: list[int], full: list[int]) -> bool:
    return 0 < len(full) <= len(prompt) and prompt[: len(full)] == full


def _classify(
    a: CallRecord, b: CallRecord, by_index: dict[int, CallRecord], parents: dict[int, int | None]
) -> PrefixBreak:
    full_a = a.prompt_ids + a.completion_ids
    shared = _common_prefix(b.prompt_ids, full_a)
    if b.prompt_ids == a.prompt_ids:
        return PrefixBreak.RESAMPLED
    ancestor: int | None = a.index
    while ancestor is not None:  # does B diverge inside the completion of A or of a call A extends?
        x = by_index[ancestor]
        if len(x.prompt_ids) <= shared < len(x.prompt_ids) + len(x.completion_ids) or (
            x is a and shared >= len(a.prompt_ids)
        ):
            return PrefixBreak.COMPLETION_REWRITTEN
        ancestor = parents[ancestor]
    if shared > 0 and shared >= NEW_CONTEXT_RATIO * min(len(a.prompt_ids), len(b.prompt_ids)):
        return PrefixBreak.HISTORY_EDITED
    return PrefixBreak.NEW_CONTEXT


def _validate(episode_id: str, calls: Sequence[CallRecord]) -> list[CallRecord]:
    ordered = sorted(calls, key=lambda c: c.index)
    for prev, call in itertools.pairwise(ordered):
        if prev.index == call.index:
            raise MergeError(
                f"duplicate call index {call.index}", episode_id=episode_id, call_index=call.index
            )
    for call in ordered:
        if len(call.logprobs) != len(call.completion_ids):
            raise MergeError(
                f"call {call.index}: {len(call.logprobs)} logprobs for {len(call.completion_ids)} completion ids",
                episode_id=episode_id,
                call_index=call.index,
            )
        if call.teacher_logprobs is not None and len(call.teacher_logprobs) != len(call.completion_ids):
            raise MergeError(
                f"call {call.index}: {len(call.teacher_logprobs)} teacher logprobs for "
                f"{len(call.completion_ids)} completion ids",
                episode_id=episode_id,
                call_index=call.index,
            )
    return ordered


def find_parents(calls: Sequence[CallRecord]) -> dict[int, int | None]:
    """The parent of every call (the earlier call it extends with the longest sequence), or ``None``.

    Args:
        calls: One episode's calls, sorted by index.

    Returns:
        ``{call index: parent call index or None}``.
    """
    parents: dict[int, int | None] = {}
    fulls = [c.prompt_ids + c.completion_ids for c in calls]
    for k, call in enumerate(calls):
        best: tuple[int, int] | None = None  # (length, position)
        for i in range(k):
            if _extends(call.prompt_ids, fulls[i]) and (best is None or len(fulls[i]) >= best[0]):
                best = (len(fulls[i]), i)
        parents[call.index] = None if best is None else calls[best[1]].index
    return parents


def _boundary(ids: Sequence[int], target: str, decode: Decode, start: int) -> int | None:
    """The ``k >= start`` with ``decode(ids[:k]) == target``, or ``None`` (not at a token boundary)."""
    base = decode(ids[:start])
    if not target.startswith(base):  # the shared ids end inside a character: search from the start
        start, base = 0, ""
    rest = target[len(base) :]
    for k in range(start, len(ids) + 1):
        piece = decode(ids[start:k])
        if piece == rest:
            return k if decode(ids[:k]) == target else None
        if len(piece) > len(rest) and not piece.endswith("\ufffd"):
            return None
    return None


def find_text_links(
    calls: Sequence[CallRecord], token_parents: dict[int, int | None], decode: Decode
) -> dict[int, tuple[int, int]]:
    """Text parents of the calls that have no token parent (see the module docstring).

    Args:
        calls: One episode's calls, sorted by index.
        token_parents: `find_parents`' result.
        decode: ids → text, special tokens kept.

    Returns:
        ``{call index: (parent call index, k)}``: the call's new tokens start at ``prompt_ids[k]``. Among
        several text parents the one with the longest prompt + answer text wins (ties: the latest).
    """
    prompts = [decode(c.prompt_ids) for c in calls]
    answers = [decode(c.completion_ids) for c in calls]
    links: dict[int, tuple[int, int]] = {}
    for j, call in enumerate(calls):
        if token_parents[call.index] is not None:
            continue
        best: tuple[int, int, int] | None = None  # (text length, position, k)
        for i in range(j):
            parent = calls[i]
            if not parent.completion_ids:
                continue
            for answer in dict.fromkeys((answers[i], visible_answer(answers[i]))):
                target = prompts[i] + answer
                if not answer or not prompts[j].startswith(target) or (best and len(target) < best[0]):
                    continue
                start = _common_prefix(call.prompt_ids, parent.prompt_ids)
                k = _boundary(call.prompt_ids, target, decode, start)
                if k is not None:
                    best = (len(target), i, k)
                    break
        if best is not None:
            links[call.index] = (calls[best[1]].index, best[2])
    return links


def _chains(calls: Sequence[CallRecord], parents: dict[int, int | None]) -> list[list[int]]:
    """Root-to-leaf paths of the prefix forest (call indices), in depth-first order by index."""
    children: dict[int | None, list[int]] = {}
    for call in calls:
        children.setdefault(parents[call.index], []).append(call.index)
    paths: list[list[int]] = []
    stack: list[list[int]] = [[root] for root in reversed(children.get(None, []))]
    while stack:
        path = stack.pop()
        kids = children.get(path[-1], [])
        if not kids:
            paths.append(path)
        stack.extend([*path, kid] for kid in reversed(kids))
    return paths


def build_samples(
    episode_id: str,
    calls: Sequence[CallRecord],
    weighting: LossWeighting = LossWeighting.EPISODE,
    *,
    merge: MergeMode = MergeMode.TOKEN,
    decode: Decode | None = None,
) -> tuple[list[Sample], MergeStats]:
    """Merge an episode's calls into training samples (see the module docstring).

    Args:
        episode_id: The episode the calls belong to.
        calls: Its call records, any order (sorted by ``index`` here).
        weighting: How sample weights are set (:class:`LossWeighting`).
        merge: Token-exact chains only (default), or text-level links too (:class:`MergeMode`).
        decode: ids → text with special tokens kept; required with ``MergeMode.TEXT``.

    Returns:
        ``(samples, stats)``: samples in chain order (depth-first over the prefix forest, children by
        call index), each with ``input_ids``, ``loss_mask``, ``behaviour_logprobs`` and ``call_ids`` of
        shape (T,); and the episode's :class:`MergeStats`.

    Raises:
        MergeError: duplicate call indices or ``len(logprobs) != len(completion_ids)`` (a recording bug).
        ValueError: ``MergeMode.TEXT`` without ``decode``.
    """
    ordered = _validate(episode_id, calls)
    by_index = {c.index: c for c in ordered}
    token_parents = find_parents(ordered)
    parents, starts, text_links = _links(ordered, by_index, token_parents, MergeMode(merge), decode)
    trained: set[int] = set()  # calls whose completion is already trained by an earlier sample
    samples: list[Sample] = []
    untrained_chains = 0
    for path in _chains(ordered, parents):
        sample = _chain_sample(episode_id, len(samples), path, by_index, starts, trained)
        if sample is None:
            untrained_chains += 1
        else:
            samples.append(sample)
    _set_weights(samples, weighting)
    stats = _episode_stats(ordered, token_parents, samples, untrained_chains)
    stats.text_merges = len(text_links)
    return samples, stats


def _links(
    ordered: list[CallRecord],
    by_index: dict[int, CallRecord],
    token_parents: dict[int, int | None],
    merge: MergeMode,
    decode: Decode | None,
) -> tuple[dict[int, int | None], dict[int, int], dict[int, tuple[int, int]]]:
    """``(parents, starts, text_links)``: each call's parent on its chain (by tokens, or in text mode by
    text), the first prompt position of each call its chain has not covered yet, and the text links."""
    parents = dict(token_parents)
    starts: dict[int, int] = {}
    for call in ordered:
        parent = token_parents[call.index]
        if parent is not None:
            starts[call.index] = len(by_index[parent].prompt_ids) + len(by_index[parent].completion_ids)
    text_links: dict[int, tuple[int, int]] = {}
    if merge is MergeMode.TEXT:
        if decode is None:
            raise ValueError("text-level merging needs decode (the tokenizer's ids -> text)")
        text_links = find_text_links(ordered, token_parents, decode)
        for index, (parent, k) in text_links.items():
            parents[index], starts[index] = parent, k
    return parents, starts, text_links


def _chain_sample(
    episode_id: str,
    index: int,
    path: list[int],
    by_index: dict[int, CallRecord],
    starts: dict[int, int],
    trained: set[int],
) -> Sample | None:
    """The sample of one chain (``None`` when it has nothing left to train); adds the calls it trains
    to ``trained``."""
    input_ids_T: list[int] = []
    loss_mask_T: list[int] = []
    logprobs_T: list[float] = []
    call_ids_T: list[int] = []
    teacher_T: list[float | None] = []
    for call_index in path:
        call = by_index[call_index]
        new_prompt = call.prompt_ids[starts.get(call_index, 0) :]
        n = len(new_prompt) + len(call.completion_ids)
        input_ids_T += new_prompt + call.completion_ids
        call_ids_T += [call_index] * n
        if call.trainable and call_index not in trained:
            trained.add(call_index)
            loss_mask_T += [0] * len(new_prompt) + [1] * len(call.completion_ids)
            logprobs_T += [0.0] * len(new_prompt) + list(call.logprobs)
            teacher: list[float | None] = [None] * len(call.completion_ids)
            if call.teacher_logprobs is not None:
                teacher = list(call.teacher_logprobs)
            teacher_T += [None] * len(new_prompt) + teacher
        else:
            loss_mask_T += [0] * n
            logprobs_T += [0.0] * n
            teacher_T += [None] * n
    if not any(loss_mask_T):
        return None
    return Sample(
        episode_id=episode_id,
        index=index,
        input_ids=input_ids_T,
        loss_mask=loss_mask_T,
        behaviour_logprobs=logprobs_T,
        call_ids=call_ids_T,
        calls=path,
        agent=by_index[path[-1]].agent,
        teacher_logprobs=teacher_T if any(t is not None for t in teacher_T) else None,
    )


def _set_weights(samples: list[Sample], weighting: LossWeighting) -> None:
    trained_S = [sum(s.loss_mask) for s in samples]
    total = sum(trained_S)
    for sample, n in zip(samples, trained_S, strict=True):
        if weighting is LossWeighting.EPISODE:
            sample.weight = n / total
        elif weighting is LossWeighting.SAMPLE:
            sample.weight = 1.0
        else:
            sample.weight = float(n)


def _episode_stats(
    calls: list[CallRecord], parents: dict[int, int | None], samples: list[Sample], untrained_chains: int
) -> MergeStats:
    breaks: Counter[str] = Counter()
    by_index = {c.index: c for c in calls}
    # the agent's latest request: its calls (several when n > 1 choices or retries share one prompt)
    latest_by_agent: dict[str, list[CallRecord]] = {}
    switches = 0
    for k, call in enumerate(calls):
        latest = latest_by_agent.get(call.agent, [])
        if latest and not any(_extends(call.prompt_ids, a.prompt_ids + a.completion_ids) for a in latest):
            breaks[_classify(latest[-1], call, by_index, parents).value] += 1
        if k > 0 and calls[k - 1].agent != call.agent:
            switches += 1
        if latest and latest[-1].prompt_ids == call.prompt_ids:
            latest.append(call)
        else:
            latest_by_agent[call.agent] = [call]
    tokens_unmerged = sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls if c.trainable)
    tokens_merged = sum(len(s.input_ids) for s in samples)
    return MergeStats(
        calls=len(calls),
        samples=len(samples),
        merge_ratio=len(calls) / len(samples) if samples else 0.0,
        prefix_breaks=dict(breaks),
        agent_switches=switches,
        splices=sum(c.splices for c in calls),
        splice_mismatches=sum(c.splice_mismatches for c in calls),
        prompt_tokens_total=sum(len(c.prompt_ids) for c in calls),
        completion_tokens_total=sum(len(c.completion_ids) for c in calls),
        tokens_unmerged=tokens_unmerged,
        tokens_merged=tokens_merged,
        tokens_saved=tokens_unmerged - tokens_merged,
        trained_tokens=sum(sum(s.loss_mask) for s in samples),
        untrained_chains=untrained_chains,
        token_breaks=sum(breaks.values()),
    )


def aggregate_stats(stats: Iterable[MergeStats]) -> MergeStats:
    """Sum per-episode stats over a batch (``merge_ratio`` recomputed as total calls / total samples)."""
    total = MergeStats(episodes=0)
    breaks: Counter[str] = Counter()
    for s in stats:
        breaks.update(s.prefix_breaks)
        for name in (
            "episodes",
            "calls",
            "samples",
            "agent_switches",
            "splices",
            "splice_mismatches",
            "prompt_tokens_total",
            "completion_tokens_total",
            "tokens_unmerged",
            "tokens_merged",
            "tokens_saved",
            "trained_tokens",
            "untrained_chains",
            "token_breaks",
            "text_merges",
        ):
            setattr(total, name, getattr(total, name) + getattr(s, name))
    total.prefix_breaks = dict(breaks)
    total.merge_ratio = total.calls / total.samples if total.samples else 0.0
    return total


def token_loss_weights(sample: Sample) -> list[float]:
    """Per-token loss coefficients of a sample, shape (T,): ``loss_mask[t] · weight / n`` (``n = Σ mask``).

    ``Σ_s Σ_t token_loss_weights(s)[t] · ℓ_s[t] / Σ_s s.weight`` is the batch loss of
    :class:`LossWeighting` (per-token losses ``ℓ`` aligned with ``input_ids``; the trainer shifts by one
    for next-token prediction).
    """
    n = sum(sample.loss_mask)
    if n == 0:
        return [0.0] * len(sample.loss_mask)
    return [m * sample.weight / n for m in sample.loss_mask]


def call_sequences(sample: Sample) -> dict[int, list[int]]:
    """Split a merged sample at call boundaries: each call's ``prompt_ids + completion_ids``.

    Every call on a chain is a prefix of the sample, ending after the last token it introduced
    (``call_ids``), so this recovers each call's token sequence exactly.
    """
    ends: dict[int, int] = {}
    end = 0
    for call in sample.calls:
        positions = [t for t, c in enumerate(sample.call_ids) if c == call]
        end = positions[-1] + 1 if positions else end
        ends[call] = end
    return {call: sample.input_ids[:end] for call, end in ends.items()}
