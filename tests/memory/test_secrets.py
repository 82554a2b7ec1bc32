"""Secrets never reach the store: redaction rules, and a scan of what the database really holds."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa

from memory import REDACTED, RunUpdate, Store, StoreConfigError, StoreUnavailable, scrub, scrub_text

if TYPE_CHECKING:
    from conftest import PostgresServer

OPENAI_KEY = "sk-proj-Zx9fakeOpenAIkey0123456789abcdef"
ANTHROPIC_KEY = "sk-ant-api03-FAKEanthropicKEY_0123456789-abcdefghijkl"
BEARER = "eyJhbGciOiJIUzI1NiJ9.fakepayload.fakesig"
HF_TOKEN = "hf_FAKEhuggingfaceTOKEN0123456789ab"
GH_TOKEN = "ghp_FAKEgithubTOKEN0123456789abcdefghij"
DB_PASSWORD = "hunter2-db-pass"
ALL_SECRETS = (OPENAI_KEY, ANTHROPIC_KEY, BEARER, HF_TOKEN, GH_TOKEN, DB_PASSWORD, "plain-config-secret")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"key {OPENAI_KEY} end", f"key {REDACTED} end"),
        (f"ANTHROPIC_API_KEY={ANTHROPIC_KEY}", f"ANTHROPIC_API_KEY={REDACTED}"),
        (f"Authorization: Bearer {BEARER}", f"Authorization: {REDACTED}"),
        (f"token {HF_TOKEN}", f"token {REDACTED}"),
        (f"push with {GH_TOKEN}", f"push with {REDACTED}"),
        ("AKIAABCDEFGHIJKLMNOP is aws", f"{REDACTED} is aws"),
        (f"postgresql://alice:{DB_PASSWORD}@db:5432/x", f"postgresql://alice:{REDACTED}@db:5432/x"),
        ('{"api_key": "abc123xyz", "lr": 0.1}', f'{{"api_key": "{REDACTED}", "lr": 0.1}}'),
        ("password=swordfish user=bob", f"password={REDACTED} user=bob"),
        # Not secrets: ordinary text, token counts, URLs without passwords, short "sk-" words.
        ("max_tokens=512 num_tokens: 40", "max_tokens=512 num_tokens: 40"),
        ("http://127.0.0.1:8000/v1 ok", "http://127.0.0.1:8000/v1 ok"),
        ("risk-free task-based sk-1", "risk-free task-based sk-1"),
        ("the bearer of bad news", "the bearer of bad news"),
    ],
)
def test_scrub_text(text: str, expected: str) -> None:
    assert scrub_text(text) == expected


def test_scrub_mapping_by_key_name_recursively() -> None:
    config = {
        "model": "SmolLM2-135M",
        "openai_api_key": "anything-at-all",
        "providers": [{"name": "anthropic", "x-api-key": "k", "Authorization": "Basic Zm9v"}],
        "server": {"url": "http://h:8000", "auth_token": "t", "password": None},
        "max_tokens": 256,
        "tokenizer": "smollm2",
        "train/token_breaks": 2,
        "client_secret": 42,
        "note": f"uses {OPENAI_KEY}",
    }
    assert scrub(config) == {
        "model": "SmolLM2-135M",
        "openai_api_key": REDACTED,
        "providers": [{"name": "anthropic", "x-api-key": REDACTED, "Authorization": REDACTED}],
        "server": {"url": "http://h:8000", "auth_token": REDACTED, "password": None},
        "max_tokens": 256,
        "tokenizer": "smollm2",
        "train/token_breaks": 2,
        "client_secret": REDACTED,
        "note": f"uses {REDACTED}",
    }


def _dump_database(store_url: str) -> str:
    """Every value of every table, as text: what an attacker reading the database would see."""
    engine = sa.create_engine(store_url)
    try:
        metadata = sa.MetaData()
        metadata.reflect(engine)
        with engine.connect() as connection:
            return "\n".join(
                repr(row) for table in metadata.sorted_tables for row in connection.execute(sa.select(table))
            )
    finally:
        engine.dispose()


def test_no_secret_is_stored_anywhere(store: Store, store_url: str) -> None:
    study = store.create_study(f"Why does the run with {OPENAI_KEY} fail?")
    hypothesis = store.register_hypothesis(
        study.id, statement="s", expected_outcome=f"e {HF_TOKEN}", decision_rule="d"
    )
    experiment = store.create_experiment(
        study.id, "e", description=f"token={GH_TOKEN}", hypothesis_id=hypothesis.id
    )
    run = store.start_run(
        experiment.id,
        config={
            "llm": {"provider": "anthropic", "api_key": ANTHROPIC_KEY},
            "headers": {"Authorization": f"Bearer {BEARER}"},
            "secret": "plain-config-secret",
        },
        server_url=f"http://swarm:{DB_PASSWORD}@127.0.0.1:8000",
    )
    store.update_run(run.id, RunUpdate(config={"api_key": OPENAI_KEY, "lr": 1e-6}))
    store.log_event(f"calling provider with key {ANTHROPIC_KEY}", run_id=run.id, level="error")
    store.finish_run(run.id, status="failed", error=f"401 Unauthorized: Bearer {BEARER}")
    artifact = store.add_artifact(study.id, "workflow", "workflow.py", f'API_KEY = "{OPENAI_KEY}"\n')
    patch = store.propose_patch(artifact.id, diff=f"+key = '{HF_TOKEN}'", rationale=f"uses {GH_TOKEN}")
    store.decide_patch(patch.id, approve=False, by="alice", note=f"never commit {OPENAI_KEY}")
    store.add_finding(
        study.id, statement=f"{ANTHROPIC_KEY} leaked", confidence=0.1, evidence=f"see {HF_TOKEN}"
    )

    dump = _dump_database(store_url)
    assert "[REDACTED]" in dump
    for secret in ALL_SECRETS:
        assert secret not in dump, secret
    # The API hands back what is stored, never the original.
    stored = store.get_run(run.id)
    assert stored.config == {"api_key": REDACTED, "lr": 1e-6}
    assert stored.server_url == f"http://swarm:{REDACTED}@127.0.0.1:8000"
    assert store.get_artifact(artifact.id).content == f'API_KEY = "{REDACTED}"\n'
    if store_url.startswith("sqlite"):
        # Not even in the raw file or its write-ahead log.
        path = Path(store_url.removeprefix("sqlite:///"))
        raw = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
        for secret in ALL_SECRETS:
            assert secret.encode() not in raw, secret


def test_store_url_and_errors_hide_the_password(postgres_server: PostgresServer) -> None:
    url = postgres_server.database()
    try:
        with_password = url.replace("postgres@", f"postgres:{DB_PASSWORD}@")  # trust auth ignores it
        with Store(with_password) as store:
            assert store.schema_revision == "0002"
            assert DB_PASSWORD not in store.url and DB_PASSWORD not in repr(store)
    finally:
        postgres_server.drop(url)
    with pytest.raises(StoreUnavailable) as caught:
        Store(f"postgresql+psycopg://alice:{DB_PASSWORD}@127.0.0.1:1/memory")
    assert DB_PASSWORD not in str(caught.value)
    with pytest.raises(StoreConfigError) as bad:
        Store(f"notadialect://alice:{DB_PASSWORD}@host/db")
    assert DB_PASSWORD not in str(bad.value)
