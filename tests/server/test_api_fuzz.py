"""API fuzzing of `batchlab serve` from its own OpenAPI document (schemathesis, in-process over ASGI).

Schemathesis reads /openapi.json of a live app (simulator, preset toy, real time) and sends
requests generated from it: valid ones, boundary values, and invalid ones (wrong types, values
out of range, missing fields, wrong methods). Every answer must conform to the document (status,
content type, headers, body schema), no answer may be a 5xx or carry a traceback, schema-valid
requests must be served, schema-invalid ones refused with a 4xx, and nothing may be written to
disk. Runs derandomized (the same cases every run), for a request-level and the iteration-level
strategy; the case counts are printed at the end (`pytest -s`) and must not fall to zero.
"""
from __future__ import annotations

import os
from collections import Counter

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import positive_data_acceptance  # noqa: E402

from batchlab.run.config import load_config  # noqa: E402
from batchlab.server.app import build_server, create_app  # noqa: E402

# Per operation and phase; ~30 s for both strategies here. BATCHLAB_FUZZ_EXAMPLES=1000 for a deeper run.
MAX_EXAMPLES = int(os.environ.get("BATCHLAB_FUZZ_EXAMPLES", "100"))
CONTEXT = 48                  # max_model_len: keeps generated max_tokens (and the simulated streams) short
CASES: Counter[str] = Counter()
STATUSES: Counter[str] = Counter()
RUNNING = [""]                # the strategy being fuzzed


@pytest.fixture(params=["dynamic", "continuous"])
def api(request, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)               # anything the server wrote would land here
    if not hasattr(request.node, "_nodeid"):  # NOTE: schemathesis 4.32 names subtests through this pytest<9 attribute
        request.node._nodeid = request.node.nodeid
    cfg = load_config(None, ["backend.kind=sim", "backend.preset=toy", "dynamic.max_wait_ms=1"])
    server = build_server(cfg, request.param, names=("toy",), max_model_len=CONTEXT, default_max_tokens=4,
                          max_body_bytes=64 << 10)
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(server))
    RUNNING[0] = request.param
    yield schema
    assert not any(tmp_path.iterdir()), "the server wrote files"
    assert CASES[request.param] > 0


def only_context_refused(ctx, response, case) -> None:
    """Replaces positive_data_acceptance: a schema-valid request may be refused only for the one
    rule JSON Schema cannot state (prompt + max_tokens over the context)."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code < 400:
        return
    error = response.json().get("error", {})
    assert response.status_code == 400 and error.get("code") == "context_length_exceeded", \
        f"schema-valid request refused: {response.status_code} {response.text[:300]}"


def no_traceback(ctx, response, case) -> None:
    assert "Traceback" not in response.text and 'File "' not in response.text, response.text[:500]


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
def test_server_answers_every_generated_request_by_its_schema(case):
    CASES[RUNNING[0]] += 1
    CASES["total"] += 1
    response = case.call_and_validate(timeout=20, excluded_checks=[positive_data_acceptance],
                                      additional_checks=[only_context_refused, no_traceback])
    mode = case.meta.generation.mode.name if case.meta else "explicit"
    streamed = isinstance(case.body, dict) and case.body.get("stream") is True
    STATUSES[f"{case.operation.label} {mode} {response.status_code}{' stream' if streamed else ''}"] += 1


def test_report_case_counts():
    """Runs after the fuzz test (file order): prints how many cases it generated."""
    print(f"\nAPI fuzz cases generated: {dict(CASES)}")
    for key, n in sorted(STATUSES.items()):
        print(f"  {key}: {n}")
