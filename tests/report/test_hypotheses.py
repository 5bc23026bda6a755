import pandas as pd
import pytest

from batchlab.report.capacity import Capacity
from batchlab.report.hypotheses import hypotheses, theory_lines


def summary(rows):
    base = {"repeat": 0, "e2e_p99": 1.0, "little_L": 1.0, "little_lambda_W": 1.0}
    return pd.DataFrame([base | r for r in rows])


def point(strategy, rate, ttft, tok_s, e2e_p99=1.0):
    return {"strategy": strategy, "rate": rate, "ttft_p50": ttft, "throughput_tok_s": tok_s, "e2e_p99": e2e_p99}


CAPS = {s: Capacity(s, 10.0, False, None) for s in ("naive", "dynamic")}
VERDICT = ["Dynamic batching raised throughput by +5% compared to naive batching at 10 req/s in simulation."]


@pytest.mark.parametrize("naive_ttft, answer", [(2.0, "holds"), (1.5, "does not hold")])
def test_h1_asks_naive_to_wait_at_least_twice_as_long_at_the_lowest_rate(naive_ttft, answer):
    s = summary([point("naive", 1, naive_ttft, 100), point("dynamic", 1, 1.0, 100),
                 point("naive", 10, 9.0, 100), point("dynamic", 10, 0.1, 100)])
    assert hypotheses(s, CAPS, VERDICT)[0][1] == answer


@pytest.mark.parametrize("dynamic_tok_s, answer", [(109, "holds"), (111, "does not hold")])
def test_h2_asks_the_same_throughput_within_ten_percent_at_the_highest_rate(dynamic_tok_s, answer):
    s = summary([point("naive", 1, 2.0, 10), point("dynamic", 1, 0.5, 10),
                 point("naive", 10, 2.0, 100), point("dynamic", 10, 0.5, dynamic_tok_s)])
    assert hypotheses(s, CAPS, VERDICT)[1][1] == answer


def test_h3_is_not_tested_without_vllm_and_judged_with_it():
    s = summary([point("naive", 10, 2.0, 100), point("dynamic", 10, 0.5, 100)])
    assert hypotheses(s, CAPS, VERDICT)[2][1] == "not tested here"
    s = summary([point("naive", 10, 2.0, 100, 5.0), point("dynamic", 10, 0.5, 110, 4.0),
                 point("vllm", 10, 0.1, 150, 2.0)])
    caps = CAPS | {"vllm": Capacity("vllm", 20.0, False, None)}
    assert hypotheses(s, caps, VERDICT)[2][1] == "holds"
    caps["vllm"] = Capacity("vllm", 5.0, False, 10.0)         # its knee is not the furthest right
    assert hypotheses(s, caps, VERDICT)[2][1] == "does not hold"


def test_h4_reads_the_verdicts_sentence():
    s = summary([point("naive", 10, 2.0, 100), point("dynamic", 10, 0.5, 100)])
    assert hypotheses(s, CAPS, VERDICT)[3][1] == "holds"
    assert hypotheses(s, CAPS, [])[3][1] == "does not hold"
    only = summary([point("continuous", 10, 0.5, 100)])
    assert [h[1] for h in hypotheses(only, {}, [])] == ["not tested here"] * 4


def test_theory_states_each_formula_at_each_rate():
    s = summary([point("naive", 4, 2.0, 100), point("dynamic", 4, 0.5, 100)])
    config = {"naive": {"batch_size": 9}, "dynamic": {"max_wait_ms": 500, "max_batch_size": 16}}
    row = next(line for line in theory_lines(s, None, config) if line.startswith("| 4 req/s"))
    assert "| 1 s |" in row                     # (9 - 1) / (2 x 4)
    assert "| 3 |" in row                       # min(1 + 4 x 0.5, 16)
