"""The OpenAI wire format: request bodies in, JSON objects and server-sent-event chunks out.

Bodies are pydantic models, so a wrong type or a value outside OpenAI's range becomes one 400
naming the field. Sampling options are checked and then ignored (outputs are greedy and exactly
`max_tokens` long); options that would change the answer's shape (logprobs, echo, best_of) are
refused by the service rather than answered with a null. Unknown fields are accepted and ignored
(as vLLM does), including `ignore_eos` and `min_tokens`. Every error the server sends uses OpenAI's
shape, {"error": {"message", "type", "param", "code"}}, which the official client turns into
BadRequestError (400), NotFoundError (404), RateLimitError (429) and so on.
"""
from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import orjson
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr

_dumps = orjson.dumps     # compact JSON as UTF-8 bytes; also escapes a token's text for the event templates


def _whole_number(value: Any) -> Any:
    """JSON Schema counts 5.0 as an integer, so the server does too (5.5, "5" and true stay errors)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[StrictInt, BeforeValidator(_whole_number)]


def _number(low: float, high: float):
    """A finite JSON number within [low, high] (an integer counts; a string, a bool, NaN or Infinity does not)."""
    return Annotated[float, Field(strict=True, ge=low, le=high, allow_inf_nan=False)]


ROLES = ("system", "developer", "user", "assistant", "tool")     # OpenAI's chat roles ("function" is retired)


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
    # accepted, checked against OpenAI's ranges, ignored: outputs are greedy and exactly max_tokens long
    temperature: _number(0, 2) | None = None
    top_p: _number(0, 1) | None = None
    presence_penalty: _number(-2, 2) | None = None
    frequency_penalty: _number(-2, 2) | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=4)] | None = None
    seed: Int | None = None
    user: StrictStr | None = None


class CompletionBody(_Body):
    prompt: StrictStr | list[Int] | list[StrictStr] | list[list[Int]]
    logprobs: Int | None = None         # typed here; any value but null is refused (server/service.py)
    echo: StrictBool | None = None
    best_of: Int | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal[ROLES]
    content: StrictStr | list[dict[str, Any]] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):     # content parts: keep the text ones
            return " ".join(str(p.get("text", "")) for p in self.content)
        return self.content or ""


class ChatBody(_Body):
    messages: list[Message] = Field(min_length=1)
    logprobs: StrictBool | None = None  # typed here; true is refused (server/service.py)
    top_logprobs: Int | None = None


def unsupported(body: _Body) -> tuple[str, str] | None:
    """(parameter, message) for an option this server cannot honour, else None. NOTE: refused, not
    ignored: a client that asks for log-probabilities and gets nulls cannot tell why."""
    # NOTE: only the endpoint's own fields: an unknown one (top_logprobs on /v1/completions) is ignored, as the schema says
    given = {k: getattr(body, k, None) for k in ("logprobs", "top_logprobs", "echo", "best_of") if k in type(body).model_fields}
    wanted = [k for k, v in given.items() if v is not None and v is not False and not (k == "best_of" and v == 1)]
    if not wanted:
        return None
    what = {"logprobs": "log-probabilities", "top_logprobs": "log-probabilities", "echo": "echoing the prompt",
            "best_of": "a best_of other than 1"}[wanted[0]]
    return wanted[0], f"{wanted[0]} is not supported: this server does not offer {what}"


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
    """Builds the objects of one response; `chat` picks the chat or the legacy completion shape.
    Stream events are bytes cut from a template made once per response: the text and the finish
    reason are the only parts of a token's event that change, and serializing the whole object
    per token was the largest share of the server's own work per token after the socket write."""

    def __init__(self, request_id: str, model: str, chat: bool):
        self.id, self.model, self.chat = request_id, model, chat
        self.created = int(time.time())
        self._first = True
        head = _dumps(self._head("chat.completion.chunk" if chat else "text_completion"))[:-1]
        inner = b'"delta":{"content":' if chat else b'"text":'
        self._open = b"data: " + head + b',"choices":[{"index":0,' + inner
        self._close = (b'},' if chat else b',') + b'"logprobs":null,"finish_reason":'

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def delta(self, text: str, finish: str | None) -> bytes:
        """One SSE event carrying new text (finish_reason rides on the last token's chunk); the
        first chat chunk also names the role."""
        opening = self._open
        if self._first and self.chat:
            opening = opening.replace(b'{"content":', b'{"role":"assistant","content":', 1)
        self._first = False
        return b"".join((opening, _dumps(text), self._close, _dumps(finish), b"}]}\n\n"))

    def usage_event(self, usage: dict[str, int], timing: dict[str, float] | None = None) -> bytes:
        obj = self._head("chat.completion.chunk" if self.chat else "text_completion")
        extra = {"batchlab_timing": timing} if timing else {}    # ignored by other clients
        return sse(obj | {"choices": [], "usage": usage} | extra)

    def error_event(self, message: str) -> bytes:
        return sse({"error": {"message": message, "type": "server_error", "param": None, "code": None}})

    def full(self, text: str, usage: dict[str, int]) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": "length"}
            return self._head("chat.completion") | {"choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        return self._head("text_completion") | {"choices": [choice], "usage": usage}


def sse(obj: Any) -> bytes:
    return b"data: " + _dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"
Kind = Literal["completion", "chat"]
