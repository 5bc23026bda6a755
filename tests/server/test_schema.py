"""The OpenAPI document states the running server's limits and its real error answers."""
from __future__ import annotations

import httpx
import pytest

pytest.importorskip("fastapi")

from batchlab.run.config import load_config  # noqa: E402
from batchlab.server.app import build_server, create_app  # noqa: E402
from batchlab.server.schema import openapi  # noqa: E402


def test_the_served_document_carries_the_servers_limits(serve):
    with serve("continuous", names=("toy", "local-model"), max_model_len=64) as (url, _):
        doc = httpx.get(url + "/openapi.json").json()
    body = doc["components"]["schemas"]["CompletionBody"]["properties"]
    assert body["model"]["enum"] == ["toy", "local-model"]
    ids = body["prompt"]["anyOf"][1]
    assert ids["items"] == {"type": "integer", "minimum": 0, "maximum": 31999} and ids["maxItems"] == 63
    assert body["max_tokens"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 63}
    assert body["n"]["maximum"] == 1
    chat = doc["components"]["schemas"]["ChatBody"]["properties"]
    assert chat["messages"]["minItems"] == 1 and chat["model"]["enum"] == ["toy", "local-model"]


def test_every_operation_documents_the_errors_it_sends_and_never_422():
    cfg = load_config(None, ["backend.kind=sim", "backend.preset=toy"])
    app = create_app(build_server(cfg, "dynamic"))
    doc = openapi(app, ("toy",), None, 4096)                # vocab None: ids only bounded below
    assert doc["components"]["schemas"]["CompletionBody"]["properties"]["prompt"]["anyOf"][1]["items"] == \
        {"type": "integer", "minimum": 0}
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert "422" not in op["responses"], path
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = doc["paths"][path]["post"]["responses"]
        assert {"200", "400", "404", "413", "429", "500", "503"} <= set(responses)
        assert responses["429"]["headers"]["Retry-After"]["required"] is True
        assert set(responses["200"]["content"]) == {"application/json", "text/event-stream"}
