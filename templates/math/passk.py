"""pass@k: the chance that at least one of k samples is correct.

Unbiased estimator of Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1:
``pass@k = 1 - C(n - c, k) / C(n, k)`` for ``n`` samples of which ``c`` are correct. Each math episode
is one sample (its ``correct`` metric); the ``G`` episodes of a GRPO group are the ``n`` samples.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task (Chen et al. 2021, eq. 1).

    Args:
        n: Samples drawn (``n >= 1``).
        c: Correct samples (``0 <= c <= n``).
        k: Budget (``1 <= k <= n``).

    Returns:
        Probability in ``[0, 1]``.

    Raises:
        ValueError: Counts out of range.
    """
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need n >= 1, 0 <= c <= n, 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(results: Iterable[tuple[str, bool]], k: int) -> float:
    """Mean pass@k over tasks from ``(task_id, correct)`` pairs (one pair per sample).

    Tasks with fewer than ``k`` samples are skipped.

    Raises:
        ValueError: No task has ``k`` samples.
    """
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for task_id, correct in results:
        counts[task_id][0] += 1
        counts[task_id][1] += int(correct)
    scores = [pass_at_k(n, c, k) for n, c in counts.values() if n >= k]
    if not scores:
        raise ValueError(f"no task has at least k={k} samples")
    return sum(scores) / len(scores)
