"""Routes a distilling server's teacher answers (docs/ARCHITECTURE.md §On-policy distillation):
``POST /v1/score`` (prompt logprobs of token ids under the served policy) and ``POST /tokenize`` (vLLM's
shape, plus the tokenizer's fingerprint, so a student can check it shares the tokenizer).

Both take a client token or the admin token where client tokens are configured (open otherwise, like
begin: whoever may sample may score); never an episode key. A client token's calls count against its
request rate, as begins and chat calls do.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from swarm.protocol import ScoreRequest, ScoreResponse, TokenizeRequest, TokenizeResponse
from swarm.server.auth import require_scorer
from swarm.server.deps import ChatDep, error_models
from swarm.server.teacher import tokenizer_fingerprint

__all__ = ["router"]

router = APIRouter(
    tags=["teacher"],
    dependencies=[Depends(require_scorer)],
    responses=error_models(
        (401, "No client token, on a server with client tokens."),
        (403, "A wrong client token (unknown or revoked) or an episode key."),
        (429, "A client token over its request rate (Retry-After says when to retry)."),
    ),
)


_SCORE_ERRORS = error_models(
    (400, "A token id outside the served model's vocabulary, or more ids than its context window."),
    (422, "An invalid body, start outside [1, len(token_ids)] included."),
)


@router.post("/v1/score", responses=_SCORE_ERRORS)
async def score(body: ScoreRequest, chat: ChatDep) -> ScoreResponse:
    """``log π(token_ids[i] | token_ids[:i])`` for ``i`` in ``[start, len)`` under the served weights
    (`swarm.engine.base.Engine.score`): what a student distilling from this server asks for."""
    version = chat.engine.policy_version
    logprobs = await chat.engine.score(body.token_ids, body.start)
    return ScoreResponse(logprobs=logprobs, policy_version=version, model=chat.model_name)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, chat: ChatDep) -> TokenizeResponse:
    """The served tokenizer's ids of ``prompt`` (vLLM's ``/tokenize``), with its vocabulary fingerprint."""
    tokenizer = chat.engine.tokenizer
    ids = [int(t) for t in tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)]
    return TokenizeResponse(
        tokens=ids,
        count=len(ids),
        max_model_len=chat.engine.max_context,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
    )
