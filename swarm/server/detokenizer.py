"""Token ids to text for the wire format: the small part of a tokenizer a response needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # transformers is heavy to import; only its type is needed here
    from transformers import PreTrainedTokenizerBase


class Detokenizer(Protocol):
    """Decodes token ids, special tokens included (``<|im_end|>`` stays visible)."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, shape (T,); a token that ends inside a UTF-8 character decodes to U+FFFD."""
        ...

    def token_text(self, token_id: int) -> str:
        """Text of one token on its own (what OpenAI's ``logprobs.content[].token`` shows)."""
        ...


class TokenizerDetokenizer:
    """`Detokenizer` over a Hugging Face tokenizer.

    Args:
        tokenizer: the model's tokenizer (`Engine.tokenizer`).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])
