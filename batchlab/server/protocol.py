"""The OpenAI wire format: request bodies in, JSON objects and server-sent-event chunks out.

Bodies are pydantic models, so a wrong type becomes one 400 naming the field. Unknown fields are
accepted and ignored (as vLLM does), including `ignore_eos` and `min_tokens`: every batchlab
backend already produces exactly `max_tokens` tokens. Every error the server sends uses OpenAI's
shape, {"error": {"message", "type", "param", "code"}}, which the official client turns into
BadRequestError (400), NotFoundError (404), RateLimitError (429) and so on.
"""
from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr


def _whole_number(value: Any) -> Any:
    """JSON Schema counts 5.0 as an integer, so the server does too (5.5, "5" and true stay errors)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[StrictInt, BeforeValidator(_whole_number)]


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: StrictStr
    max_tokens: Int | None = None
    max_completion_tokens: Int | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Int = 1
    temperature: StrictFloat | StrictInt | None = None     # accepted, ignored: outputs are greedy


class CompletionBody(_Body):
    prompt: StrictStr | list[Int] | list[StrictStr] | list[list[Int]]


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: StrictStr | list[dict[str, Any]] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):     # content parts: keep the text ones
            return " ".join(str(p.get("text", "")) for p in self.content)
        return self.content or ""


class ChatBody(_Body):
    messages: list[Message] = Field(min_length=1)


ERROR_TYPES = {404: "not_found_error", 429: "rate_limit_error", 503: "service_unavailable"}


class APIError(Exception):
    """Raised by handlers for a request the server refuses; rendered as an OpenAI-style JSON error
    (`type`: invalid_request_error for a 4xx not named in ERROR_TYPES, server_error for a 5xx)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def response(self) -> JSONResponse:
        kind = ERROR_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """One line from pydantic/FastAPI validation errors, and the parameter it concerns."""
    e = errors[0]
    loc = [str(p) for p in e.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None
    where = ".".join(loc) or "body"
    if e.get("type") == "json_invalid":
        return "request body is not valid JSON", None
    if not loc:                 # NOTE: also a body sent without Content-Type: application/json
        return "request body must be a JSON object (Content-Type: application/json)", None
    if param == "prompt":       # a union: pydantic names the first alternative tried, which misleads
        return "prompt must be a string, a list of token ids (integers), or a list of one of either", param
    return f"{where}: {e.get('msg', 'invalid value')}", param


class Chunks:
    """Builds the objects of one response; `chat` picks the chat or the legacy completion shape."""

    def __init__(self, request_id: str, model: str, chat: bool):
        self.id, self.model, self.chat = request_id, model, chat
        self.created = int(time.time())
        self._first = True

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def delta(self, text: str, finish: str | None) -> str:
        """One SSE event carrying new text (finish_reason rides on the last token's chunk)."""
        if self.chat:
            delta = {"role": "assistant", "content": text} if self._first else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = self._head("chat.completion.chunk") | {"choices": [choice]}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            obj = self._head("text_completion") | {"choices": [choice]}
        self._first = False
        return sse(obj)

    def usage_event(self, usage: dict[str, int], timing: dict[str, float] | None = None) -> str:
        obj = self._head("chat.completion.chunk" if self.chat else "text_completion")
        extra = {"batchlab_timing": timing} if timing else {}    # ignored by other clients
        return sse(obj | {"choices": [], "usage": usage} | extra)

    def error_event(self, message: str) -> str:
        return sse({"error": {"message": message, "type": "server_error", "param": None, "code": None}})

    def full(self, text: str, usage: dict[str, int]) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": "length"}
            return self._head("chat.completion") | {"choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        return self._head("text_completion") | {"choices": [choice], "usage": usage}


def sse(obj: Any) -> str:
    return "data: " + json.dumps(obj, separators=(",", ":")) + "\n\n"


DONE = "data: [DONE]\n\n"
Kind = Literal["completion", "chat"]
