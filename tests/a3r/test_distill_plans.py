"""a3r plans on-policy distillation (issue 38): ``a3r vibe "distil <teacher> into the embedded model on
arithmetic"`` distils a teacher (a URL, or a checkpoint directory a3r serves itself) and ``a3r research``
compares distillation against GRPO alone, offline, through the real planner and CLI (dry runs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from a3r.app.cli import app
from a3r.errors import PlanError
from a3r.providers import OfflineProvider
from a3r.study.plans import PlanDraft, TrainingSettings, check_plan
from a3r.study.request import check_request
from a3r.study.settings import serve_flags
from a3r.study.teacher import read_teacher
from swarm.client import ServeOptions

URL = "http://127.0.0.1:8001"


def _model_folder(folder: Path) -> Path:
    """A folder a teacher server could serve: a Hugging Face model's config.json and weights (names only:
    planning reads no weights)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def _invoke(tmp_path: Path, *args: str) -> tuple[int, str]:
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db")]
    result = CliRunner().invoke(app, [*args, *common])
    return result.exit_code, result.output


def test_vibe_distils_a_teacher_server_with_pure_distillation(tmp_path: Path) -> None:
    plan = OfflineProvider().plan(f"distil {URL} into the embedded model on arithmetic", mode="train")
    assert plan.template == "arithmetic" and plan.kind == "train"
    assert (plan.training.teacher, plan.training.distill, plan.training.distill_mode) == (URL, True, "pure")
    assert plan.objective == f"distil the teacher ({URL}) into the policy on the arithmetic template"
    flags = serve_flags(plan.training)
    assert (flags["teacher-url"], flags["distill"], flags["distill-coef"]) == (URL, "pure", 1.0)
    distill = ServeOptions.from_flags({**flags, "train": True}).to_server_config().training.distill
    assert distill is not None and (distill.teacher_url, distill.mode) == (URL, "pure")
    code, output = _invoke(
        tmp_path, "vibe", f"distil {URL} into the embedded model on arithmetic", "--dry-run"
    )
    assert code == 0, output
    assert f"teacher={URL}, distill=True, distill_mode=pure, distill_coef=1.0" in output
    assert f"  distillation: swarm serve --teacher-url {URL} --distill pure" in output


def test_a_plan_without_a_teacher_reads_and_serves_as_before(tmp_path: Path) -> None:
    plan = OfflineProvider().plan("train arithmetic", mode="train")
    assert (plan.training.teacher, plan.training.distill) == (None, False)
    assert serve_flags(plan.training)["distill"] is None  # left at swarm's default: no --distill
    assert "--distill" not in ServeOptions.from_flags(serve_flags(plan.training)).argv()
    code, output = _invoke(tmp_path, "vibe", "train arithmetic", "--dry-run")
    assert code == 0 and "teacher" not in output and "distill" not in output, output


def test_a_checkpoint_teacher_is_served_by_a3r(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _model_folder(tmp_path / "teacher" / "checkpoints" / "step-000020")
    monkeypatch.chdir(tmp_path)
    plan = OfflineProvider().plan(
        "distill ./teacher/checkpoints/step-000020 into the embedded model on arithmetic", mode="train"
    )
    assert plan.training.teacher == str(folder.resolve())  # absolute: runs start elsewhere
    code, output = _invoke(
        tmp_path, "vibe", f"distil {folder} into the embedded model on arithmetic", "--dry-run"
    )
    assert code == 0, output
    assert (
        f"  distillation: teacher server: swarm serve --model {folder.resolve()} --no-train; student: "
        "swarm serve --teacher-url <its URL> --distill pure" in output
    )


def test_another_pairs_path_is_not_a_second_teacher() -> None:
    teacher, rest = read_teacher(f"distil {URL} into the embedded model on arithmetic dataset=/data/t.jsonl")
    assert teacher == URL and rest.endswith("dataset=/data/t.jsonl")


def test_mixed_distillation_with_its_coefficient() -> None:
    plan = OfflineProvider().plan(
        f"distil {URL} into the embedded model on arithmetic with the reward distill_coef=0.5", mode="train"
    )
    assert (plan.training.distill_mode, plan.training.distill_coef) == ("mixed", 0.5)
    assert serve_flags(plan.training)["distill"] == "mixed"


@pytest.mark.parametrize(
    ("request_text", "refusal"),
    [
        ("distil into the embedded model on arithmetic", "distillation needs a teacher"),
        ("distil /no/such/dir into the embedded model on arithmetic", "no such checkpoint directory"),
        ("distil teacher=http:// into the embedded model on arithmetic", "a URL needs a host"),
        (
            "distil http://127.0.0.1:8101 and http://127.0.0.1:8102 into the embedded model on arithmetic",
            "the request names 2 teachers",
        ),
        (
            "distil teacher=http://127.0.0.1:8101 teacher=http://127.0.0.1:8102 into the embedded model",
            "the request names 2 teachers",
        ),
    ],
)
def test_a_teacher_that_cannot_be_used_is_refused_in_one_line(
    tmp_path: Path, request_text: str, refusal: str
) -> None:
    with pytest.raises(PlanError, match=refusal):
        OfflineProvider().plan(request_text, mode="train")
    code, output = _invoke(tmp_path, "vibe", request_text, "--dry-run")
    assert code == 1 and output.count("\n") == 1 and refusal in output, output


@pytest.mark.parametrize(
    ("files", "refusal"),
    [
        ((), "is not a Hugging Face model directory (no config.json)"),
        (("adapter_config.json", "adapter_model.safetensors"), "is a LoRA checkpoint (adapters only)"),
        (("config.json",), "no weights (model.safetensors or pytorch_model.bin)"),
    ],
)
def test_a_teacher_folder_that_cannot_be_served_is_refused_in_one_line(
    tmp_path: Path, files: tuple[str, ...], refusal: str
) -> None:
    folder = tmp_path / "teacher"
    folder.mkdir()
    for name in files:
        (folder / name).write_text("{}")
    request = f"distil {folder} into the embedded model on arithmetic"
    with pytest.raises(PlanError, match=re.escape(refusal)):
        OfflineProvider().plan(request, mode="vibe")
    code, output = _invoke(tmp_path, "vibe", request, "--dry-run")
    assert code == 1 and output.count("\n") == 1 and refusal in output, output
    assert "swarm serve" not in output or "merge" in output


def test_any_providers_plan_must_distil_the_requests_teacher() -> None:
    request = f"distil {URL} into the embedded model on arithmetic"
    plain = check_plan(PlanDraft(kind="train", template="arithmetic", objective="x"))
    with pytest.raises(PlanError, match="the plan's teacher is None"):
        check_request(request, plain)
    undistilled = plain.model_copy(update={"training": TrainingSettings(teacher=URL)})
    with pytest.raises(PlanError, match="the plan does not"):
        check_request(request, undistilled)
    with pytest.raises(PlanError, match="distillation needs a teacher"):
        check_plan(plain.model_copy(update={"training": TrainingSettings(distill=True)}))
    # a URL or a path never names a task: "spy" in the path is not who-is-the-spy
    assert read_teacher("distil http://spy-host:8001/ into the model on arithmetic") == (
        "http://spy-host:8001",
        "distil the teacher into the model on arithmetic",
    )


@pytest.mark.parametrize(
    ("question", "coarse", "objective"),
    [
        (f"does distilling {URL} beat GRPO alone on arithmetic", [0.0, 1.0], "does pure distillation"),
        (f"does GRPO alone beat distilling {URL} on arithmetic", [1.0, 0.0], "does GRPO alone beat"),
        (f"distillation from {URL} vs GRPO only on arithmetic", [1.0, 0.0], "does GRPO alone beat"),
    ],
)
def test_research_compares_distillation_against_grpo_alone(
    question: str, coarse: list[float], objective: str
) -> None:
    plan = OfflineProvider().plan(question, mode="research")
    assert plan.sweep is not None
    assert (plan.sweep.variable, plan.sweep.goal, plan.sweep.coarse) == ("distill", "a_vs_b", coarse)
    assert plan.objective.startswith(objective)
    assert plan.training.teacher == URL and not plan.training.distill  # each arm sets its own
    arms = [plan.training.model_copy(update={"distill": bool(v)}) for v in plan.sweep.coarse]
    assert [serve_flags(arm).get("teacher-url") for arm in arms] == [
        URL if v else None for v in plan.sweep.coarse
    ]
    assert len(plan.training.seeds) >= 2 and plan.hypotheses


def test_research_dry_run_shows_the_distillation_arm(tmp_path: Path) -> None:
    code, output = _invoke(
        tmp_path,
        "research",
        f"does distilling {URL} beat GRPO alone on arithmetic",
        "--dry-run",
        "--budget-minutes",
        "120",
    )
    assert code == 0, output
    assert "varied: teacher distillation (distill, training setting)" in output
    assert "goal: a-vs-b" in output and "distill ∈ {false, true}" in output
    assert f"  distillation (its distillation arm): swarm serve --teacher-url {URL} --distill pure" in output
    effect = OfflineProvider().plan(f"effect of distilling {URL} on arithmetic", mode="research")
    assert effect.sweep is not None and (effect.sweep.goal, effect.sweep.coarse) == ("effect_of", [0.0, 1.0])


def test_a_configurations_identity_names_the_teacher_only_when_there_is_one() -> None:
    from a3r.graph.records import config_identity

    plain = OfflineProvider().plan("best lr on arithmetic", mode="research")
    assert not {"teacher", "distill", "distill_mode", "distill_coef"} & set(
        config_identity(plain, None)["training"]
    )
    compared = OfflineProvider().plan(f"does distilling {URL} beat GRPO alone on arithmetic", mode="research")
    training = config_identity(compared, None)["training"]
    assert training["teacher"] == URL and "distill" not in training  # the varied setting is not identity
    other = OfflineProvider().plan(
        "does distilling http://127.0.0.1:9009 beat GRPO alone on arithmetic", mode="research"
    )
    assert config_identity(other, None) != config_identity(compared, None)  # another teacher: another study


def test_an_llms_plan_carries_the_teacher_as_a3r_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from a3r.providers.chat import ChatProvider
    from tests.a3r.fake_llm import ToolCallingFakeChatModel, tool_answers

    _model_folder(tmp_path / "t")
    monkeypatch.chdir(tmp_path)
    request = "distil ./t into the embedded model on arithmetic"
    written = {
        "kind": "train",
        "template": "arithmetic",
        "objective": "distil t",
        "training": {"teacher": "./t", "distill": True},  # as the request wrote it
    }
    model = ToolCallingFakeChatModel(messages=tool_answers(("PlanDraft", written)))
    plan = ChatProvider(model, name="fake").plan(request, mode="vibe")
    assert plan.training.teacher == str((tmp_path / "t").resolve()) and plan.training.distill
    dropped = {**written, "training": {"distill": True}}
    model = ToolCallingFakeChatModel(messages=tool_answers(("PlanDraft", dropped)))
    with pytest.raises(PlanError, match="distillation needs a teacher"):
        ChatProvider(model, name="fake").plan(request, mode="vibe")


def test_distillation_options_are_the_plans_not_serve_options(tmp_path: Path) -> None:
    for item, said in (
        (f"teacher={URL}", "name the teacher in the request"),
        ("distill-coef=0.5", "write distill_coef=<value> in the request"),
        ("distill=mixed", "write distill=<value> in the request"),
    ):
        code, output = _invoke(tmp_path, "vibe", "train arithmetic", "--dry-run", "--serve-option", item)
        assert code == 1 and said in output and output.count("\n") == 1, output


def test_a_distilling_run_is_not_zero_signal_and_records_the_teachers_metrics() -> None:
    from a3r.study.analysis import EpisodeRecord, detect_all
    from a3r.swarmops.execution import _numeric
    from swarm.client import ServerStepMetrics

    tied = [
        EpisodeRecord(
            task_id=f"t{i // 4}", round=0, member=i % 4, kind="train", status="finished", reward=0.0
        )
        for i in range(8)
    ]  # every attempt fails: GRPO's advantages are all 0, the teacher's are not
    assert [d.kind.value for d in detect_all(rows=[], episodes=tied, group_size=4)] == ["zero_signal"]
    assert detect_all(rows=[], episodes=tied, group_size=4, rewards_only=False) == []
    row = ServerStepMetrics.model_construct(
        step=1, loss=0.5, distill={"teacher_kl": 0.25, "scored_frac": 1.0, "teacher_kl/default": 0.25}
    )  # the fields _numeric reads
    values = _numeric(row)
    assert (values["distill/teacher_kl"], values["distill/scored_frac"]) == (0.25, 1.0)
    assert values["distill/teacher_kl/default"] == 0.25 and "distill" not in values


def test_a_teacher_url_that_does_not_answer_is_refused_before_anything_starts(tmp_path: Path) -> None:
    from a3r.swarmops.processes import free_port

    request = f"distil http://127.0.0.1:{free_port()} into the embedded model on arithmetic"
    code, output = _invoke(tmp_path, "vibe", request)
    assert code == 1 and output.count("\n") == 1 and "cannot reach it" in output, output
    assert "thread" not in output and not (tmp_path / "memory.db").exists()  # no thread, no store
    code, output = _invoke(tmp_path, "vibe", request, "--dry-run")  # a dry run stays offline
    assert code == 0 and "distillation: swarm serve --teacher-url" in output, output


def test_a_teacher_url_is_asked_with_its_credential(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from a3r.swarmops.teacher import check_teacher_answers, teacher_token

    class Teacher(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/v1/models" and self.headers.get("Authorization") == "Bearer s3cret"
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(b'{"data": []}')

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Teacher)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        monkeypatch.delenv("SWARM_TEACHER_TOKEN", raising=False)
        assert teacher_token({}) is None
        with pytest.raises(PlanError, match="answered 401: give its credential"):
            check_teacher_answers(url, teacher_token({}))
        monkeypatch.setenv("SWARM_TEACHER_TOKEN", "s3cret")
        check_teacher_answers(url, teacher_token({}))
        (tmp_path / "token").write_text("s3cret\n")
        monkeypatch.delenv("SWARM_TEACHER_TOKEN")
        check_teacher_answers(url, teacher_token({"teacher-token-file": str(tmp_path / "token")}))
    finally:
        server.shutdown()
        server.server_close()


def test_a_servers_start_failure_reads_as_its_error_line_not_its_progress_bars() -> None:
    from a3r.swarmops.processes import error_line

    log = (
        "INFO: loading the model\n"
        "Loading weights:   0%|          | 0/272 [00:00<?, ?it/s]\r"
        "Loading weights:  40%|####      | 110/272 [00:01<00:01, 99.1it/s]\r"
        "Loading weights: 100%|##########| 272/272 [00:02<00:00, 120.0it/s]\n"
        "\x1b[31merror: teacher http://127.0.0.1:9 cannot be reached: connection refused\x1b[0m\n"
        "Loading weights: 100%|##########| 272/272 [00:02<00:00, 120.0it/s]\r\n"
    )
    assert error_line(log) == "error: teacher http://127.0.0.1:9 cannot be reached: connection refused"
    assert error_line("Traceback (most recent call last):\nValueError: bad\n") == "ValueError: bad"
    assert error_line("Loading weights:   0%|          | 0/2 [00:00<?, ?it/s]\r") == "(no output)"


def test_a_coefficient_with_pure_distillation_is_refused_in_the_plan() -> None:
    """swarm serve refuses a --distill-coef that pure distillation would ignore; the plan refuses it first."""
    from pydantic import ValidationError

    from a3r.study.plans import TrainingSettings

    with pytest.raises(ValidationError, match="only in mixed distillation"):
        TrainingSettings(teacher=URL, distill=True, distill_mode="pure", distill_coef=0.5)
    assert (
        TrainingSettings(teacher=URL, distill=True, distill_mode="mixed", distill_coef=0.5).distill_coef
        == 0.5
    )
    assert TrainingSettings(teacher=URL, distill=True).distill_coef == 1.0
