"""``ServeOptions``: the one model behind ``swarm serve``'s flags, a3r's ``--serve-option`` items and the
server configuration they build."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from swarm.batch import BatchPolicy
from swarm.cli import app
from swarm.client import ServeOptions, ServeOptionsError
from swarm.protocol import LossAggregation


def test_the_cli_is_generated_from_the_model() -> None:
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    options = {p.name: p for p in command.params}
    assert list(options) == [*ServeOptions.model_fields, "check"]
    for name, info in ServeOptions.model_fields.items():
        assert options[name].help == info.description, name
    assert options["lr"].default == ServeOptions().lr and options["group_size"].default == 8


def test_flags_build_the_server_config(tmp_path: Path) -> None:
    options = ServeOptions.from_flags(
        {"--lora-rank": "4", "group-size": "2", "quota": "math=1", "max-staleness": "1", "run-dir": tmp_path}
    )
    config = options.to_server_config()
    assert config.run_dir == tmp_path and config.training.max_staleness == 1
    assert config.training.batch.group_size == 2 and config.training.batch.policy is BatchPolicy.TASKS
    assert config.training.trainer.lora is not None and config.training.trainer.lora.r == 4
    assert config.training.trainer.loss_agg is LossAggregation.SEQ_MEAN_TOKEN_MEAN
    assert config.training.quotas is not None and config.training.quotas.shares == {"math": 1.0}


def test_argv_renders_the_options_set_in_field_order() -> None:
    options = ServeOptions.from_flags({"max-steps": None, "lr": 2e-5, "train": False, "tis-cap": "2"})
    assert options.argv() == ["--no-train", "--lr", "2e-05", "--tis-cap", "2"]
    assert ServeOptions.from_flags({"admin-token": "s3cret", "quota": ["a=1"]}).argv() == ["--quota", "a=1"]
    secret = ServeOptions.from_flags({"client-token": "c=s3cret-token", "max-n": 4})
    assert secret.argv() == ["--max-n", "4"]  # tokens travel in the environment, never on a command line


def test_client_tokens_come_from_flags_and_a_file(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# team tokens\nalice=alice-token-0001  # the first\n\nbare-token-000000002\n")
    config = ServeOptions(client_token=["bob=bob-token-000003"], client_tokens_file=tokens).to_server_config()
    names = {name: secret.get_secret_value() for name, secret in config.client_tokens.items()}
    assert names["alice"] == "alice-token-0001" and names["bob"] == "bob-token-000003"
    (bare,) = [n for n in names if n.startswith("client-")]
    assert names[bare] == "bare-token-000000002" and bare == "client-1"  # by its place, not its secret
    with pytest.raises(ServeOptionsError, match="line 2: expected NAME=TOKEN") as refused:
        tokens.write_text("ok=long-enough-token-16\nx=tiny\n")
        ServeOptions(client_tokens_file=tokens).to_server_config()
    assert "tiny" not in str(refused.value)  # a token is never echoed


def test_bare_client_tokens_are_numbered_past_the_names_given() -> None:
    """Names of bare tokens count from 1 in the order given, skip names given explicitly, and are not
    derived from the secret (a hash of it would let anyone reading the name check guesses offline)."""
    options = ServeOptions(
        client_token=["first-bare-token-01", "client-2=named-token-00002", "second-bare-token-2"]
    )
    names = {n: s.get_secret_value() for n, s in options.to_server_config().client_tokens.items()}
    assert names == {
        "client-1": "first-bare-token-01",
        "client-2": "named-token-00002",
        "client-3": "second-bare-token-2",
    }


@pytest.mark.parametrize(
    "token",
    ["ünïcödé-secret-secret", "tab\tsecretsecretsecret", "line1secretsecret\r\nX-Injected: 1"],
    ids=["non-ascii", "tab", "crlf"],
)
def test_tokens_no_header_can_carry_are_refused(token: str) -> None:
    """A token outside visible ASCII could never authenticate: refused in one message that names the rule
    and never the token, for a client token and for the admin token."""
    for options in (ServeOptions(client_token=[f"alice={token}"]), ServeOptions(admin_token=token)):
        with pytest.raises(ServeOptionsError, match="only visible ASCII characters") as refused:
            options.to_server_config()
        assert token not in str(refused.value) and "secret" not in str(refused.value)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"bogus": "1"}, "No such option: --bogus"),
        (
            {"max-staleness": "abc"},
            "Invalid value for '--max-staleness': 'abc': Input should be a valid integer",
        ),
        ({"max-staleness": "-1"}, "--max-staleness: Input should be greater than or equal to 0"),
        (
            {"group-size": "1"},
            "--batch-policy/--batch-size/--group-size: group_size 1 with the 'tasks' policy",
        ),
        ({"lora-rank": "2", "lr": "3"}, "--lr: Input should be less than or equal to 1"),
        ({"quota": "math"}, "--quota 'math': expected FAMILY=SHARE"),
        ({"dtype": "float16"}, "full fine-tuning of float16 weights loses AdamW updates"),
    ],
)
def test_mistakes_name_the_flag(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ServeOptionsError) as refused:
        ServeOptions.from_flags(flags).to_server_config()
    assert str(refused.value).startswith(message)


def test_check_adds_the_device_model_and_run_dir(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for flags, message in [
        ({"device": "banana"}, "--device banana: not a torch device"),
        ({"run-dir": tmp_path / "file"}, f"--run-dir {tmp_path / 'file'}: exists and is not a folder"),
        ({"model": str(tmp_path / "none")}, "--model model path"),
    ]:
        with pytest.raises(ServeOptionsError, match="^" + message.replace("(", r"\(")):
            ServeOptions.from_flags({"run-dir": tmp_path / "run", **flags}).check()
    assert ServeOptions.from_flags({"run-dir": tmp_path / "run"}).check().port == 8000
    assert not (tmp_path / "run").exists()


def test_check_tries_the_run_dir_instead_of_trusting_permission_bits(tmp_path: Path) -> None:
    """Root passes ``os.access`` on /proc, where mkdir fails: the check must try (and clean up)."""
    with pytest.raises(ServeOptionsError, match=r"^--run-dir /proc/swarm-run/x: cannot write there \("):
        ServeOptions.from_flags({"run-dir": "/proc/swarm-run/x"}).check()
    nested = tmp_path / "a" / "b" / "c"
    ServeOptions.from_flags({"run-dir": nested}).check()
    assert not (tmp_path / "a").exists()  # what the check created, it removed
    ServeOptions.from_flags({"run-dir": tmp_path}).check()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"engine": "banana"}, "--engine: Input should be 'hf' or 'vllm'"),
        (
            {"engine": "vllm", "gpu-memory-utilization": "0"},
            "--gpu-memory-utilization: Input should be greater",
        ),
        (
            {"gpu-memory-utilization": "1.5"},
            "--gpu-memory-utilization: Input should be less than or equal to 1",
        ),
    ],
)
def test_engine_options_are_refused_in_one_line(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ServeOptionsError) as caught:
        ServeOptions.from_flags(flags).to_server_config()
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_vllm_engine_is_checked_before_anything_loads(tmp_path: Path) -> None:
    import importlib.util

    import torch

    options = ServeOptions.from_flags({"engine": "vllm", "run-dir": tmp_path / "run"})
    assert options.to_server_config().engine == "vllm"
    with pytest.raises(ServeOptionsError) as caught:
        options.check()
    message = str(caught.value)
    assert message.startswith("--engine vllm: ") and "\n" not in message
    if importlib.util.find_spec("vllm") is None:
        assert "pip install 'a3r[vllm]'" in message
    elif not torch.cuda.is_available():
        assert "CUDA GPU" in message
    else:  # vLLM and a GPU, but the trainer left on the CPU
        assert "use --device cuda" in message


def test_merge_option_sets_text_level_merging_and_names_a_bad_value() -> None:
    from swarm.tracking.merge import MergeMode

    assert ServeOptions().to_server_config().training.merge is MergeMode.TOKEN
    assert ServeOptions(merge="text").to_server_config().training.merge is MergeMode.TEXT
    with pytest.raises(ServeOptionsError, match="--merge"):
        ServeOptions(merge="bytes").to_server_config()


def test_option_files_that_are_not_text_end_in_one_line(tmp_path: Path) -> None:
    binary = tmp_path / "tokens.bin"
    binary.write_bytes(b"\xff\xfe\x00alice=secret-token")
    for flag in ("client-tokens-file", "training-config"):
        with pytest.raises(ServeOptionsError, match=f"^--{flag} {binary}: not UTF-8 text$"):
            ServeOptions.from_flags({flag: binary, "run-dir": tmp_path / "run"}).check()


def test_max_request_tokens_defaults_to_a_share_of_the_context(tmp_path: Path) -> None:
    """Left out: half the model's context window (resolved once the engine is loaded, `context_cap`);
    an explicit value is kept; 0 lifts the cap (the context window only)."""
    left_out = ServeOptions.from_flags({"run-dir": tmp_path}).to_server_config()
    assert left_out.limits.max_tokens is None and left_out.request_tokens_share == 0.5
    explicit = ServeOptions.from_flags({"run-dir": tmp_path, "max-request-tokens": "300"}).to_server_config()
    assert explicit.limits.max_tokens == 300 and explicit.request_tokens_share is None
    lifted = ServeOptions.from_flags({"run-dir": tmp_path, "max-request-tokens": "0"}).to_server_config()
    assert lifted.limits.max_tokens is None and lifted.request_tokens_share is None
    with pytest.raises(ServeOptionsError, match="--max-request-tokens"):
        ServeOptions.from_flags({"run-dir": tmp_path, "max-request-tokens": "-3"}).to_server_config()
