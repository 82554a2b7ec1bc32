"""Final-answer extraction shared by the templates (templates.answers)."""

import pytest

from templates.answers import (
    AnswerStatus,
    boxed_contents,
    extract_final_answer,
    extract_short_number,
    gsm8k_marker,
    strip_thinking,
)


def test_strip_thinking_removes_closed_blocks_and_everything_after_an_unclosed_one():
    assert strip_thinking("a <think>b</think> c").split() == ["a", "c"]
    assert strip_thinking("a <THINK>b</think> c <think> d").split() == ["a", "c"]
    assert strip_thinking("<think>never closed \\boxed{1}") == ""


def test_boxed_contents_balances_braces():
    text = r"x \boxed{\frac{1}{2}} y \fbox{3} z \boxed {4} \boxed{unclosed"
    assert boxed_contents(text) == [r"\frac{1}{2}", "3", "4"]


def test_gsm8k_marker_follows_the_official_normalisation():
    assert gsm8k_marker("so #### 1,234") == "1234"
    assert gsm8k_marker("#### 5\n#### 7") == "7"
    assert gsm8k_marker("####5") is None


@pytest.mark.parametrize(
    ("text", "status", "answer"),
    [
        (r"\boxed{42}", AnswerStatus.OK, "42"),
        (r"\boxed{42} again \boxed{ 42 }", AnswerStatus.OK, "42"),
        (r"\boxed{42} or \boxed{43}", AnswerStatus.AMBIGUOUS, None),
        (r"<think>\boxed{43}</think>\boxed{42}", AnswerStatus.OK, "42"),
        (r"<think>\boxed{42}</think>", AnswerStatus.MISSING, None),
        ("#### 42", AnswerStatus.OK, "42"),
        ("", AnswerStatus.MISSING, None),
        (r"\boxed{}", AnswerStatus.MISSING, None),
        ("\\boxed{" + "1," * 60 + "}", AnswerStatus.TOO_LONG, None),
        ("x" * 20_001, AnswerStatus.TOO_LONG, None),
    ],
)
def test_extract_final_answer(text, status, answer):
    got = extract_final_answer(text)
    assert got.status == status
    assert got.answer == answer


@pytest.mark.parametrize(
    ("text", "status", "answer"),
    [
        ("7", AnswerStatus.OK, "7"),
        (" 7.\nMore text 8 9", AnswerStatus.OK, "7"),
        ("The answer is 7.", AnswerStatus.OK, "7"),
        ("3 + 4 = 7", AnswerStatus.OK, "7"),
        ("1,234", AnswerStatus.OK, "1234"),
        ("-12", AnswerStatus.OK, "-12"),
        (r"\boxed{7}", AnswerStatus.OK, "7"),
        ("6 7 8", AnswerStatus.AMBIGUOUS, None),
        ("seven", AnswerStatus.MISSING, None),
        ("", AnswerStatus.MISSING, None),
        ("<think>7</think>", AnswerStatus.MISSING, None),
        ("7" + " " * 400, AnswerStatus.TOO_LONG, None),
    ],
)
def test_extract_short_number(text, status, answer):
    got = extract_short_number(text)
    assert got.status == status
    assert got.answer == answer
