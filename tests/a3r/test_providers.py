"""Providers through their official SDKs against a loopback server speaking the real wire formats,
the offline provider's planning and honesty, and key handling."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from a3r.errors import OfflineUnsupported, PlanError, ProviderConfigError, ProviderError
from a3r.providers import (
    ChatProvider,
    OfflineProvider,
    ProviderConfig,
    ProviderKind,
    chat_model,
    make_provider,
    read_params,
)
from a3r.study.analysis import Diagnosis, DiagnosisKind
from a3r.study.plans import PlanDraft
from tests.a3r.fake_llm import FakeLLMServer

SECRET = "sk-test-DO-NOT-LEAK-4242424242424242"

PLAN = {
    "kind": "train",
    "template": "countdown",
    "params": {"n_numbers": 3, "max_tokens": 64},
    "objective": "train countdown briefly",
    "training": {
        "steps": 3,
        "batch_size": 2,
        "group_size": 4,
        "lr": 1e-5,
        "concurrency": 4,
        "seeds": [0],
        "smoke_tasks": 1,
    },
    "hypotheses": [
        {
            "statement": "reward rises",
            "expected_outcome": "last > first",
            "decision_rule": "last-2 mean > first-2 mean",
        }
    ],
    "sweep": None,
    "stability": None,
    "rationale": "countdown matches",
}


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[FakeLLMServer]:
    server = FakeLLMServer(canned={"PlanDraft": PLAN}).start()
    yield server
    server.stop()


@pytest.fixture()
def fresh(fake_llm: FakeLLMServer) -> FakeLLMServer:
    fake_llm.requests.clear()
    fake_llm.fail_with = None
    return fake_llm


def _anthropic(server: FakeLLMServer) -> ProviderConfig:
    return ProviderConfig.from_env(
        "anthropic", model="claude-test", base_url=server.url, environ={"ANTHROPIC_API_KEY": SECRET}
    )


def _openai(server: FakeLLMServer) -> ProviderConfig:
    return ProviderConfig.from_env(
        "openai", model="gpt-test", base_url=f"{server.url}/v1", environ={"OPENAI_API_KEY": SECRET}
    )


def test_anthropic_plan_through_the_messages_api(fresh: FakeLLMServer) -> None:
    plan = make_provider(_anthropic(fresh)).plan("train countdown", mode="vibe")
    assert isinstance(plan, PlanDraft) and plan.template == "countdown"
    assert (
        plan.params["n_numbers"] == 3 and plan.params["max_number"] == 20
    )  # defaults completed by check_plan
    (request,) = fresh.requests
    assert request["api"] == "anthropic"
    headers = request["headers"]
    assert SECRET in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))
    assert "anthropic-version" in headers
    body = request["body"]
    assert body["model"] == "claude-test"
    assert body["tools"][0]["name"] == "PlanDraft"
    assert body["tool_choice"]["type"] in ("tool", "any")
    assert "countdown" in body["system"] if isinstance(body["system"], str) else body["system"]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_openai_plan_through_chat_completions(fresh: FakeLLMServer, method: str) -> None:
    model = chat_model(_openai(fresh))
    answer = model.with_structured_output(PlanDraft, method=method).invoke("plan: train countdown")
    assert isinstance(answer, PlanDraft) and answer.objective == "train countdown briefly"
    request = fresh.requests[-1]
    assert request["headers"]["authorization"] == f"Bearer {SECRET}"
    if method == "json_schema":
        assert request["body"]["response_format"]["json_schema"]["name"] == "PlanDraft"
    else:
        assert request["body"]["tools"][0]["function"]["name"] == "PlanDraft"


def test_openai_provider_plan_checks_template(fresh: FakeLLMServer) -> None:
    fresh.canned["PlanDraft"] = {**PLAN, "template": "chess"}
    try:
        with pytest.raises(PlanError, match="chess"):
            make_provider(_openai(fresh)).plan("train chess", mode="vibe")
    finally:
        fresh.canned["PlanDraft"] = PLAN


@pytest.mark.parametrize("config", [_anthropic, _openai])
def test_provider_errors_never_carry_the_key(fresh: FakeLLMServer, config: Any) -> None:
    fresh.fail_with = 401
    cfg = config(fresh).model_copy(update={"max_retries": 0})
    with pytest.raises(ProviderError) as info:
        make_provider(cfg).plan("train countdown", mode="vibe")
    assert SECRET not in str(info.value)
    assert SECRET not in repr(cfg) and SECRET not in str(cfg.model_dump())


def test_from_env_requires_keys() -> None:
    with pytest.raises(ProviderConfigError, match="ANTHROPIC_API_KEY"):
        ProviderConfig.from_env("anthropic", environ={})
    with pytest.raises(ProviderConfigError, match="OPENAI_API_KEY"):
        ProviderConfig.from_env("openai", environ={})
    with pytest.raises(ProviderConfigError, match="unknown provider"):
        ProviderConfig.from_env("gemini", environ={})
    with pytest.raises(ProviderConfigError, match="base_url"):
        ProviderConfig.from_env("openai", base_url="localhost:8000", environ={"OPENAI_API_KEY": "k"})
    local = ProviderConfig.from_env("openai", base_url="http://127.0.0.1:11434/v1", environ={})
    assert local.api_key is None and local.kind is ProviderKind.openai


# ----------------------------------------------------------------------------------------- offline
@pytest.mark.parametrize(
    ("request_text", "mode", "template", "checks"),
    [
        ("train who-is-the-spy", "vibe", "who_is_the_spy", {}),
        ("find min stable batch size on AIME", "research", "math", {"dataset": "aime"}),
        (
            "train arithmetic level 3 with temperature 0.5 for 6 steps",
            "vibe",
            "arithmetic",
            {"level": 3, "temperature": 0.5},
        ),
    ],
)
def test_offline_plans(request_text: str, mode: Any, template: str, checks: dict[str, Any]) -> None:
    plan = OfflineProvider().plan(request_text, mode=mode)
    assert plan.template == template
    for key, value in checks.items():
        assert plan.params[key] == value
    assert plan.hypotheses and all(h.decision_rule for h in plan.hypotheses)
    if mode == "research":
        assert plan.sweep is not None and plan.sweep.variable == "batch_size"
        assert plan.sweep.coarse == [1, 2, 4, 8]
        assert plan.stability is not None and len(plan.training.seeds) >= plan.stability.min_seeds >= 2
        assert "stable" in plan.hypotheses[0].expected_outcome
    if "6 steps" in request_text:
        assert plan.training.steps == 6


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        # found by a fresh user: "NUM steps" read the 3 of "batch_size=3 steps=2" as the steps
        ("train arithmetic batch_size=3 steps=2", {"steps": 2, "batch_size": 3}),
        ("train arithmetic steps=2 batch_size=3", {"steps": 2, "batch_size": 3}),
        (
            "train arithmetic 20 steps with batch size of 8 lr=1e-3",
            {"steps": 20, "batch_size": 8, "lr": 1e-3},
        ),
        ("train arithmetic group_size=6 seeds=2", {"group_size": 6, "seeds": [0, 1]}),
    ],
)
def test_offline_reads_name_value_pairs_first(request_text: str, expected: dict[str, Any]) -> None:
    plan = OfflineProvider().plan(request_text, mode="vibe")
    assert {k: getattr(plan.training, k) for k in expected} == expected
    # the plan's why: line names the training settings it read
    read = plan.rationale.split("training settings read from the request: ")[1].split(";")[0]
    assert read == ", ".join(f"{k} = {expected[k]!r}" for k in sorted(expected))


@pytest.mark.parametrize(
    ("request_text", "refusal"),
    [
        # found by a fresh user: these were silently ignored
        ("train who-is-the-spy n_player=6", r"unknown setting n_player=6 .*did you mean n_players"),
        ("train arithmetic foo=3", r"unknown setting foo=3 .*training settings: steps, batch_size"),
        ("train arithmetic weight_decay=0.1", r"unknown setting weight_decay=0\.1"),
        ("train arithmetic warmup=10", r"unknown setting warmup=10"),
        ("train arithmetic clip=0.1", r"unknown setting clip=0\.1 .*did you mean clip_eps"),
        ("train arithmetic max_staleness=1", r"pass it as --serve-option max-staleness=1"),
        ("train arithmetic level=2 level=3", r"level is given twice with different values \(2, 3\)"),
        ("find the best kl_coef on arithmetic tis_cap=2", r"--serve-option tis-cap=2"),
    ],
)
def test_offline_refuses_name_value_pairs_it_would_not_use(request_text: str, refusal: str) -> None:
    mode = "research" if request_text.startswith("find") else "vibe"
    with pytest.raises(PlanError, match=refusal) as caught:
        OfflineProvider().plan(request_text, mode=mode)
    assert "\n" not in str(caught.value)


def test_offline_applies_training_pairs_a_serve_option_would_set() -> None:
    plan = OfflineProvider().plan(
        "train arithmetic kl_coef=0.1 clip_eps=0.3 ppo_epochs=2 level=2 level=2", mode="vibe"
    )
    assert (plan.training.kl_coef, plan.training.clip_eps, plan.training.ppo_epochs) == (0.1, 0.3, 2)
    assert plan.params["level"] == 2


def test_offline_is_honest_about_what_it_cannot_do() -> None:
    provider = OfflineProvider()
    with pytest.raises(OfflineUnsupported, match="LLM provider"):
        provider.plan("train a chess engine", mode="vibe")
    with pytest.raises(OfflineUnsupported, match="LLM provider"):
        provider.plan("why does countdown reward plateau", mode="research")
    plan = provider.plan("train arithmetic", mode="vibe")
    with pytest.raises(OfflineUnsupported, match="LLM provider"):
        provider.write_code("train arithmetic", plan)
    with pytest.raises(PlanError, match="level"):
        provider.plan("train arithmetic level 9", mode="vibe")


def test_offline_patch_raises_low_temperature(tmp_path: Any) -> None:
    import templates

    rendered = templates.render("arithmetic", {"temperature": 0.0, "n_tasks": 8}, tmp_path / "ws")
    files = {"workflow.py": rendered.workflow.read_text(), "tasks.jsonl": rendered.tasks.read_text()}
    diagnosis = Diagnosis(
        kind=DiagnosisKind.zero_signal,
        summary="4/4 groups identical",
        evidence={"all_zero_groups": 4, "all_same_positive_groups": 0},
        patchable=True,
    )
    draft = OfflineProvider().propose_patch(diagnosis, files, template="arithmetic")
    assert draft is not None and draft.file == "workflow.py"
    assert read_params(draft.new_content)["temperature"] == 1.0
    # At temperature 1 the next rule applies: level 1 cannot get easier, so no patch for all-zero groups.
    files["workflow.py"] = draft.new_content
    assert OfflineProvider().propose_patch(diagnosis, files, template="arithmetic") is None
    crash = Diagnosis(kind=DiagnosisKind.crash, summary="boom", patchable=True)
    assert OfflineProvider().propose_patch(crash, files, template="arithmetic") is None


def test_chat_provider_wraps_schema_mismatch() -> None:
    from tests.a3r.fake_llm import ToolCallingFakeChatModel, tool_answers

    model = ToolCallingFakeChatModel(messages=tool_answers(("PlanDraft", {"kind": "train"})))
    with pytest.raises(ProviderError):
        ChatProvider(model, name="fake").plan("train countdown", mode="vibe")


def test_llm_hypotheses_say_the_seeds_asked_for(
    fresh: FakeLLMServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app
    from a3r.study.design import reword_seeds

    assert reword_seeds("on two seeds (seeds 0 and 1), at most 6 seeds", [0, 1], [0, 1, 2]) == (
        "on 3 seeds (seeds [0, 1, 2]), at most 6 seeds"
    )
    fresh.canned["PlanDraft"] = {
        **PLAN,
        "kind": "research",
        "template": "arithmetic",
        "params": {},
        "objective": "find the best KL coefficient",
        "training": {**PLAN["training"], "seeds": [0, 1]},
        "sweep": {"variable": "kl_coef", "coarse": [0.0, 0.1], "goal": "best"},
        "hypotheses": [
            {
                "statement": "a small KL penalty helps on 2 seeds",
                "expected_outcome": "seeds [0, 1] both higher at 0.1",
                "decision_rule": "mean over the 2 seeds at 0.1 exceeds 0 by 0.05",
            }
        ],
    }
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    common += ["--provider", "anthropic", "--base-url", fresh.url, "--provider-model", "claude-test"]
    result = CliRunner().invoke(
        app, ["research", "find the best KL coefficient on arithmetic", "--seeds", "3", *common]
    )
    assert result.exit_code == 0, result.output
    assert "hypothesis: a small KL penalty helps on 3 seeds" in result.output
    assert "decision rule: mean over the 3 seeds at 0.1 exceeds 0 by 0.05" in result.output
    assert "2 seeds" not in result.output.split("hypothesis:")[1]


@pytest.mark.parametrize(
    ("request_text", "refusal"),
    [
        # the plan (PLAN: countdown, batch_size 2, steps 3) dropped or changed what the request gave
        (
            "train countdown batch_size=3",
            r"the plan does not use batch_size=3 of the request: it has batch_size = 2",
        ),
        ("train countdown n_numbers=4", r"does not use n_numbers=4 .* it has n_numbers = 3"),
        ("train countdown lr=1e-4", r"does not use lr=1e-4 .* it has lr = 1e-05"),
        # the same refusals as the offline planner's, from the shared check
        ("train countdown n_number=4", r"unknown setting n_number=4 .*did you mean n_numbers"),
        ("train countdown max_staleness=1", r"pass it as --serve-option max-staleness=1"),
        ("train countdown lr=nan", r"lr=nan: nan and inf are not numbers"),
        ("train countdown then arithmetic", r"names 2 tasks \(countdown, arithmetic\)"),
    ],
)
@pytest.mark.parametrize("config", [_anthropic, _openai])
def test_an_llm_plan_is_checked_against_the_request_pairs(
    fresh: FakeLLMServer, config: Any, request_text: str, refusal: str
) -> None:
    """Found by a fresh user: an LLM's plan was not checked for the request's name=value pairs."""
    fresh.canned["PlanDraft"] = PLAN
    with pytest.raises(PlanError, match=refusal) as caught:
        make_provider(config(fresh)).plan(request_text, mode="vibe")
    assert "\n" not in str(caught.value)


def test_an_llm_plan_that_uses_the_request_pairs_passes(fresh: FakeLLMServer) -> None:
    fresh.canned["PlanDraft"] = PLAN
    plan = make_provider(_openai(fresh)).plan(
        "train countdown batch_size=2 steps=3 n_numbers=3 max_tokens=64 lr=1e-5", mode="vibe"
    )
    assert (plan.training.batch_size, plan.params["n_numbers"]) == (2, 3)
