"""The OpenAPI document of `batchlab serve`, stating the limits of the server that is running.

FastAPI derives the bodies' types from protocol.py; this module adds what the handlers actually
accept (the served model names, token ids below the backend's vocabulary size, max_tokens within
the context, one non-blank prompt per request, n = 1), every error answer in OpenAI's shape
(FastAPI's 422 is never sent: a validation error is a 400), and the shapes of the answers. The
API fuzz test (tests/server/test_api_fuzz.py) generates requests from this document and checks
the server against it, so document and code cannot drift apart unnoticed.
NOTE: one rule cannot be said in JSON Schema: prompt tokens + max_tokens must fit the context
(a 400 with code `context_length_exceeded`).
"""
from __future__ import annotations

from typing import Any

from fastapi.openapi.utils import get_openapi

INT, STR, BOOL = {"type": "integer"}, {"type": "string"}, {"type": "boolean"}
NULL = {"type": "null"}
NOT_BLANK = {"type": "string", "pattern": r"\S"}         # the server strips whitespace, then refuses ""


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict, description: str, **extra) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}, **extra}


ERRORS = {
    "400": "Invalid request: not JSON, a wrong type, a value outside its range, a blank prompt, token ids outside "
           "the vocabulary, max_tokens < 1, n != 1, an option this server does not offer (logprobs, echo, best_of > 1; "
           "code unsupported_parameter), or prompt + max_tokens over the context (code context_length_exceeded)",
    "404": "No such model (code model_not_found)",
    "408": "The body did not arrive within --timeout-body of the headers (code request_timeout)",
    "413": "Request body over --max-body-bytes (code request_too_large)",
    "429": "The queue is full (--max-queue); retry after Retry-After seconds",
    "500": "The request failed inside the engine",
    "503": "The server is shutting down (code shutting_down), its engine has stopped, or --limit-concurrency "
           "connections are already open (code too_many_connections)",
}
RETRY_AFTER = {"Retry-After": {"required": True, "schema": {"type": "string", "pattern": r"^\d+$"}}}

ANSWERS = {
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": STR, "type": STR, "param": {"anyOf": [STR, NULL]},
                       "code": {"anyOf": [STR, NULL]}}}}},
    "Usage": {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
              "properties": {"prompt_tokens": {"type": "integer", "minimum": 1},
                             "completion_tokens": {"type": "integer", "minimum": 1},
                             "total_tokens": {"type": "integer", "minimum": 2}}},
    "Timing": {"type": "object", "required": ["arrival", "first_token", "last_token"],
               "description": "The server's own stamps (perf_counter seconds)",
               "properties": {k: {"type": "number"} for k in ("arrival", "first_token", "last_token")}},
    "Completion": {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
                   "properties": {"id": STR, "object": {"const": "text_completion"}, "created": INT, "model": STR,
                                  "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
                                      "type": "object", "required": ["index", "text", "finish_reason"],
                                      "properties": {"index": {"const": 0}, "text": STR,
                                                     "finish_reason": {"enum": ["length", "stop"]}}}},
                                  "usage": _ref("Usage"), "batchlab_timing": _ref("Timing")}},
    "ChatCompletion": {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
                       "properties": {"id": STR, "object": {"const": "chat.completion"}, "created": INT, "model": STR,
                                      "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
                                          "type": "object", "required": ["index", "message", "finish_reason"],
                                          "properties": {"index": {"const": 0}, "finish_reason": {"enum": ["length", "stop"]},
                                                         "message": {"type": "object", "required": ["role", "content"],
                                                                     "properties": {"role": {"const": "assistant"},
                                                                                    "content": STR}}}}},
                                      "usage": _ref("Usage"), "batchlab_timing": _ref("Timing")}},
    "CompletionChunk": {"type": "object", "required": ["id", "object", "created", "model", "choices"],
                        "properties": {"id": STR, "object": {"const": "text_completion"}, "created": INT, "model": STR,
                                       "choices": {"type": "array", "maxItems": 1, "items": {
                                           "type": "object", "required": ["index", "text", "finish_reason"],
                                           "properties": {"index": {"const": 0}, "text": STR,
                                                          "finish_reason": {"enum": ["length", "stop", None]}}}},
                                       "usage": _ref("Usage"), "batchlab_timing": _ref("Timing")}},
    "ChatCompletionChunk": {"type": "object", "required": ["id", "object", "created", "model", "choices"],
                            "properties": {"id": STR, "object": {"const": "chat.completion.chunk"}, "created": INT,
                                           "model": STR, "choices": {"type": "array", "maxItems": 1, "items": {
                                               "type": "object", "required": ["index", "delta", "finish_reason"],
                                               "properties": {"index": {"const": 0},
                                                              "finish_reason": {"enum": ["length", "stop", None]},
                                                              "delta": {"type": "object", "required": ["content"],
                                                                        "properties": {"role": {"const": "assistant"},
                                                                                       "content": STR}}}}},
                                           "usage": _ref("Usage"), "batchlab_timing": _ref("Timing")}},
    "ModelList": {"type": "object", "required": ["object", "data"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["id", "object", "created", "owned_by"],
            "properties": {"id": STR, "object": {"const": "model"}, "created": INT, "owned_by": STR}}}}},
    "Health": {"type": "object", "required": ["status"], "properties": {
        "status": {"enum": ["ok", "error"]}, "queue_depth": {"type": "integer", "minimum": 0},
        "running": {"type": "integer", "minimum": 0}, "error": STR}},
}


def openapi(app, model_names: tuple[str, ...], vocab: int | None, context: int) -> dict[str, Any]:
    """The document for `app`, serving `model_names`, token ids below `vocab` (None: unchecked)
    and `context` tokens of prompt + output."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas.update(ANSWERS)
    for body in ("CompletionBody", "ChatBody"):
        _limit_body(schemas[body]["properties"], model_names, context)
        _refuse_unsupported(schemas[body]["properties"], body)
    _limit_prompt(schemas["CompletionBody"]["properties"], vocab, context)
    paths = doc["paths"]
    paths["/v1/completions"]["post"]["responses"] = _generation("Completion")
    paths["/v1/chat/completions"]["post"]["responses"] = _generation("ChatCompletion")
    paths["/v1/models"]["get"]["responses"] = {"200": _json(_ref("ModelList"), "The served model names")}
    paths["/health"]["get"]["responses"] = {"200": _json(_ref("Health"), "The engine is running"),
                                            "503": _json(_ref("Health"), "The engine has stopped")}
    paths["/metrics"]["get"]["responses"] = {"200": {"description": "Prometheus text exposition",
                                                     "content": {"text/plain": {"schema": STR}}}}
    return doc


SAMPLING = {"temperature": (0, 2), "top_p": (0, 1), "presence_penalty": (-2, 2), "frequency_penalty": (-2, 2)}
UNSUPPORTED = {"CompletionBody": {"logprobs": (), "echo": (False,), "best_of": (1,)},      # the values accepted
               "ChatBody": {"logprobs": (False,), "top_logprobs": ()}}


def _limit_body(props: dict, model_names: tuple[str, ...], context: int) -> None:
    tokens = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": max(1, context - 1)}, NULL]}
    props["model"] = {"type": "string", "enum": list(model_names)}
    props["max_tokens"] = tokens | {"description": "Output tokens, exactly (EOS is ignored)"}
    props["max_completion_tokens"] = tokens | {"description": "The same as max_tokens, and wins over it"}
    props["n"] = {"type": "integer", "minimum": 1, "maximum": 1, "default": 1}
    props["stream_options"] = {"anyOf": [{"type": "object", "properties": {"include_usage": BOOL}}, NULL]}
    ignored = "Checked against OpenAI's range, then ignored: outputs are greedy and exactly max_tokens long"
    for key, (low, high) in SAMPLING.items():
        props[key] = {"anyOf": [{"type": "number", "minimum": low, "maximum": high}, NULL], "description": ignored}
    props["stop"] = {"anyOf": [STR, {"type": "array", "items": STR, "maxItems": 4}, NULL], "description": ignored}


def _refuse_unsupported(props: dict, body: str) -> None:
    refused = "Anything else is refused (400, code unsupported_parameter): this server returns text only"
    for key, allowed in UNSUPPORTED[body].items():
        props[key] = {"anyOf": [{"const": v} for v in allowed] + [NULL], "description": refused}


def _limit_prompt(props: dict, vocab: int | None, context: int) -> None:
    token = {"type": "integer", "minimum": 0} | ({"maximum": vocab - 1} if vocab else {})
    ids = {"type": "array", "items": token, "minItems": 1, "maxItems": max(1, context - 1)}
    props["prompt"] = {"anyOf": [NOT_BLANK, ids,
                                 {"type": "array", "items": NOT_BLANK, "minItems": 1, "maxItems": 1},
                                 {"type": "array", "items": ids, "minItems": 1, "maxItems": 1}],
                       "description": "Text, or token ids; a list of one of either (no batched prompts)"}


def _event(chunk: str) -> dict[str, Any]:
    """One server-sent event: a JSON chunk (or an error, when the request failed), then [DONE]."""
    json_data = {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"anyOf": [_ref(chunk), _ref("Error")]}}
    return {"type": "object", "required": ["data"],
            "properties": {"data": {"if": {"const": "[DONE]"}, "else": json_data}}}


def _generation(answer: str) -> dict[str, Any]:
    ok = {"description": f"A {answer} object; with stream=true, server-sent events of {answer}Chunk objects "
                         "(the last may be an error) ending in [DONE]",
          "content": {"application/json": {"schema": _ref(answer)},
                      "text/event-stream": {"schema": _event(answer + "Chunk")}}}
    errors = {code: _json(_ref("Error"), text, **({"headers": RETRY_AFTER} if code == "429" else {}))
              for code, text in ERRORS.items()}
    return {"200": ok, **errors}
