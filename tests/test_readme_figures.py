"""Every figure the README quotes from a benchmark is rendered from a committed result file
(docs/results/*.json) by benchmarks/readme_figures.py: the README must agree with those files."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def figures():
    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "benchmarks" / "readme_figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_quotes_exactly_what_the_result_files_hold():
    readme = (ROOT / "README.md").read_text()
    blocks = [name for name in figures().RENDER if f"<!-- figures:{name} -->" in readme]
    assert blocks, "the README has no generated figures block"
    for name in blocks:
        assert (ROOT / "docs" / "results" / f"{name}.json").is_file(), f"{name}: no result file behind its block"
    assert figures().render(readme, ROOT / "docs" / "results") == readme, \
        "README figures differ from docs/results: run python benchmarks/readme_figures.py"


def test_a_changed_result_file_changes_the_readme(tmp_path):
    """The check can fail: one repeat of a committed file edited, and its block no longer matches."""
    mod = figures()
    readme = (ROOT / "README.md").read_text()
    name = next(n for n in mod.RENDER if f"<!-- figures:{n} -->" in readme)
    for f in (ROOT / "docs" / "results").glob("*.json"):
        (tmp_path / f.name).write_text(f.read_text())
    data = json.loads((tmp_path / f"{name}.json").read_text())
    data["load_avg_1_5_15"]["before"][0] += 10.0
    (tmp_path / f"{name}.json").write_text(json.dumps(data))
    assert mod.render(readme, tmp_path) != readme


def _serving_result(vllm_passes: list[float | None]) -> dict:
    def server(name, sustained):
        rates = [8.0, 16.0, 32.0]
        passes = [{"sustained_rate": r, "saturated_tok_s": 1000.0,
                   "points": [{"rate": x, "throughput_tok_s": 10 * x, "ttft_p99": 0.1, "served_share": 1.0,
                               "sustained": r is not None and x <= r} for x in rates]}
                  for r in sustained]
        return {"server": name, "passes": passes, "memory": {}}
    return {"command": "python benchmarks/serving.py", "cpus": 2, "pinned": True,
            "load_avg_1_5_15": {"before": [0.5], "after": [0.7]},
            "trace": {"arrival": "poisson", "rates": [8.0, 16.0, 32.0], "duration_s": 32, "warmup_s": 2,
                      "prompt_len": 32, "output_len": 32},
            "slo": {"ttft_s": 2.0}, "keeps_up": 0.95, "sweep_repeats": 2,
            "servers": [server("batchlab serve continuous", [16.0, 16.0]), server("batchlab serve naive", [None, None]),
                        server("vllm", vllm_passes)]}


def test_the_serving_block_says_none_highest_tried_and_when_passes_disagree():
    mod = figures()
    agree = mod.serving(_serving_result([8.0, 8.0]))
    assert "| batchlab serve naive | none / none |" in agree
    assert "**2.00×**" in agree and "disagree" not in agree
    capped = mod.serving(_serving_result([32.0, 8.0]))
    assert "≥ 32 (highest tried) / 8" in capped
    assert "the passes disagree on which is higher" in capped     # 16/32 = 0.5 and 16/8 = 2


def test_keeps_up_is_completed_over_arrived_rate():
    """The serving benchmark's 'sustained' rule: a queue that grows serves less than arrives."""
    import importlib.util
    import sys
    from types import SimpleNamespace
    spec = importlib.util.spec_from_file_location("serving_bench", ROOT / "benchmarks" / "serving.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("serving_bench", mod)
    spec.loader.exec_module(mod)
    reqs = [SimpleNamespace(arrival_time=1.0 + i * 0.1) for i in range(101)]     # 10 req/s over 10 s
    assert abs(mod.keeps_up({"requests_per_s": 10.0}, reqs, 1.0) - 1.0) < 1e-9
    assert abs(mod.keeps_up({"requests_per_s": 9.0}, reqs, 1.0) - 0.9) < 1e-9
    assert mod.keeps_up({"requests_per_s": float("nan")}, reqs, 1.0) == 0.0
    assert mod.keeps_up({"requests_per_s": 5.0}, reqs[:1], 1.0) == 0.0
