"""Math template: reward (math-verify), data, pass@k."""

import pytest

from templates.math import data, passk
from templates.math.reward import GARBAGE, gold_completion, is_equivalent, reward, self_check


@pytest.fixture(scope="module")
def all_tasks():
    return data.build("all")


def test_data_keeps_ids_and_counts(all_tasks):
    ids = [t["id"] for t in all_tasks]
    assert len(ids) == len(set(ids)) == 260
    assert ids[0] == "aime24-01" and "aime25-30" in ids and ids[-1] == "gsm8k-0200"
    assert len(data.build("aime")) == 60
    assert [t["id"] for t in data.build("gsm8k", limit=3)] == ["gsm8k-0001", "gsm8k-0002", "gsm8k-0003"]
    with pytest.raises(ValueError, match="unknown dataset"):
        data.build("mmlu")


def test_every_gold_answer_earns_full_reward(all_tasks):
    assert all(reward(gold_completion(t), t["answer"]) == 1.0 for t in all_tasks)


def test_self_check_passes_and_catches_a_lenient_reward(all_tasks, monkeypatch):
    assert self_check(all_tasks[:5]) == []
    import templates.math.reward as module

    monkeypatch.setattr(module, "reward", lambda completion, answer, **_: 1.0)
    assert len(module.self_check(all_tasks[:1])) == len(GARBAGE)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (r"so $\boxed{204}$", 1.0),
        (r"\boxed{204.0}", 1.0),
        (r"\boxed{\frac{408}{2}}", 1.0),
        (r"\boxed{204 \text{ minutes}}", 1.0),
        ("Step by step...\n#### 204", 1.0),
        (r"<think>maybe \boxed{7}</think> final: \boxed{204}", 1.0),
        (r"\boxed{204} and to be sure \boxed{204}", 1.0),
        ("", 0.0),
        ("204", 0.0),  # no box, no marker: the format is part of the task
        (r"\boxed{203}", 0.0),
        (r"\boxed{204} \boxed{203}", 0.0),
        (r"\boxed{203, 204, 205}", 0.0),
        (r"\boxed{204 \text{ or } 205}", 0.0),
        (r"\boxed{\{204, 205\}}", 0.0),
        (r"<think>\boxed{204}</think>", 0.0),
        (r"<think>\boxed{204}", 0.0),
        (r"\boxed{204", 0.0),
        (r"\boxed{x}", 0.0),
        ("\\boxed{204}" + " pad" * 6000, 0.0),
    ],
)
def test_reward_tricky_outputs(completion, expected):
    assert reward(completion, "204") == expected


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        (r"\boxed{\$18}", "18"),
        (r"\boxed{18.00}", "18"),
        (r"\boxed{1,234}", "1234"),
        (r"\boxed{1{,}234}", "1234"),
        ("#### 1,234", "1234"),
        (r"\boxed{033}", "33"),
    ],
)
def test_reward_accepts_usual_number_formats(completion, answer):
    assert reward(completion, answer) == 1.0


def test_is_equivalent_handles_latex_and_garbage():
    assert is_equivalent(r"\frac{1}{2}", "0.5")
    assert not is_equivalent(r"\frac{1}{3}", "0.5")
    assert not is_equivalent("}{", "1")


def test_pass_at_k_matches_the_closed_form():
    assert passk.pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert passk.pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert passk.pass_at_k(5, 0, 3) == 0.0
    assert passk.pass_at_k(5, 4, 2) == 1.0
    with pytest.raises(ValueError):
        passk.pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        passk.pass_at_k(3, 1, 4)


def test_mean_pass_at_k_groups_by_task():
    results = [("a", True), ("a", False), ("b", False), ("b", False), ("c", True)]
    assert passk.mean_pass_at_k(results, 1) == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert passk.mean_pass_at_k(results, 2) == pytest.approx((1.0 + 0.0) / 2)
    with pytest.raises(ValueError, match="k=3"):
        passk.mean_pass_at_k(results, 3)
