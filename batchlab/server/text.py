"""Prompts to token counts, output tokens to text: exact with a tokenizer, placeholders without.

A Hugging Face backend has a tokenizer: prompts are encoded exactly and output ids decoded
(incrementally, so a character split across tokens comes out whole). The simulator has no
tokenizer and no real tokens: a text prompt counts one token per whitespace-separated word,
and the output is deterministic placeholder text, one word per token. Usage counts are exact
either way (they are the backend's token stamps); only the simulator's *text* is made up.
"""
from __future__ import annotations

import functools
from typing import Any

from batchlab.core.request import Request

try:
    from tokenizers.decoders import DecodeStream
except ImportError:             # tokenizers before 0.21, or none at all (the simulator's server)
    DecodeStream = None

PLACEHOLDER = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit"]


class TextCodec:
    def __init__(self, tokenizer: Any | None = None):
        self.tokenizer = tokenizer

    @property
    def exact(self) -> bool:
        return self.tokenizer is not None

    def encode(self, prompt: str | list[int]) -> tuple[list[int] | None, int]:
        """(token ids or None, prompt length in tokens)."""
        if isinstance(prompt, list):
            return list(prompt), len(prompt)
        if self.tokenizer is None:
            return None, len(prompt.split())
        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return ids, len(ids)

    def chat_prompt(self, messages: list[tuple[str, str]]) -> str:
        """The chat turned into one prompt: the tokenizer's chat template if it has one."""
        tok = self.tokenizer
        if tok is not None and getattr(tok, "chat_template", None):
            try:
                return tok.apply_chat_template([{"role": r, "content": c} for r, c in messages],
                                               tokenize=False, add_generation_prompt=True)
            except Exception as e:  # noqa: BLE001 - templates raise what they like (jinja's raise_exception)
                raise ValueError(f"messages: the chat template refused them: {e}") from None
        return "".join(f"{role}: {content}\n" for role, content in messages) + "assistant:"

    def delta(self, r: Request, start: int, end: int, state: dict) -> list[str]:
        """Text of output tokens start..end-1, one string per token (calls for one response go
        in order and share `state`)."""
        if self.tokenizer is None or len(r.output_token_ids) < end:
            return [" " + PLACEHOLDER[k % len(PLACEHOLDER)] for k in range(start, end)]
        if self._streams:
            stream = state.get("stream")
            if stream is None:
                stream = state["stream"] = DecodeStream(skip_special_tokens=True)
            rust = self.tokenizer.backend_tokenizer
            return [stream.step(rust, t) or "" for t in r.output_token_ids[start:end]]
        out = []
        for k in range(start, end):
            full = self.tokenizer.decode(r.output_token_ids[: k + 1], skip_special_tokens=True)
            if full.endswith("\ufffd"):           # half of a multi-byte character: wait for the rest
                out.append("")
                continue
            out.append(full[len(state.get("text", "")):])
            state["text"] = full
        return out

    @functools.cached_property
    def _streams(self) -> bool:
        """Whether tokens can be decoded one at a time by the tokenizer's own incremental decoder
        (`tokenizers`' DecodeStream: the text a token adds, held back while it ends inside a
        character) instead of decoding the whole output again per token. Only for a fast
        tokenizer that does not rewrite spaces after decoding: what `decode` then returns for the
        whole output is exactly the stream's pieces joined."""
        tok = self.tokenizer
        return (DecodeStream is not None and getattr(tok, "backend_tokenizer", None) is not None
                and not getattr(tok, "clean_up_tokenization_spaces", False))
