"""Every command in a fenced `bash` block of README.md or docs/ is run by a test or says what it needs.

The convention (docs/contributing.md): a command that a checkout with `make test`'s environment
cannot run in a test ends with a marker, `# needs: gpu` (one or more of MARKERS). Every other
command is either run here (RUN: the command as printed, shortened with a few arguments, in a
scratch directory with configs/ and benchmarks/ beside it) or by another test (ELSEWHERE). A
command that is neither fails `test_every_command_is_run_or_says_what_it_needs`; an entry that
matches no command any more fails `test_no_entry_outlives_its_command`.
"""
from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.docs.shell import ROOT, all_commands, scratch, sh

MARKERS = {
    "gpu": "a CUDA GPU",
    "vllm": "vLLM installed (batchlab vllm up: minutes and a package registry)",
    "server": "a server already listening at the address shown",
    "foreground": "runs until stopped (a server)",
    "network": "a package registry or the model hub",
    "cluster": "a Ray cluster of several machines",
    "data": "a file the reader brings that is not in the repository",
    "long": "many minutes: a benchmark or a full sweep on a real model",
}

# Commands another test runs: command as printed -> "path::function" (or "path::text" for a file
# that is not Python: the text must appear in it).
ELSEWHERE = {
    "make run": "tests/test_cli.py::test_the_default_runs_first_line_is_the_capacity_headline_and_the_readme_quotes_it",
    "make test": ".ci/run::make test",
    ".venv/bin/mkdocs build --strict": "Makefile::mkdocs build --strict",
    "batchlab run --set traffic.rates=[2,8,32] --set dynamic.max_wait_ms=20":
        "tests/test_cli.py::test_the_readme_sequence_keeps_two_experiments_apart",
    "batchlab report results/latest": "tests/test_cli.py::test_the_readme_sequence_keeps_two_experiments_apart",
    "batchlab run configs/policies.yaml --out results/policies":
        "tests/schedulers/test_readme_policy.py::test_the_readme_quotes_what_configs_policies_yaml_reports",
    "batchlab run configs/policies.yaml --set 'strategies=[continuous, my_policy:EarliestDeadlineFirst]'":
        "tests/schedulers/test_readme_policy.py::test_readme_policy_runs_on_the_simulator_from_the_command_line",
    "batchlab run configs/smoke.yaml --set 'strategies=[continuous, my_policy:EarliestDeadlineFirst]'":
        "tests/schedulers/test_readme_policy.py::test_readme_policy_runs_unchanged_on_the_hf_step_engine",
    "batchlab run configs/burst.yaml": "tests/docs/test_figures.py::test_the_burst_table",
    "batchlab run configs/sessions.yaml --out results/sessions": "tests/docs/test_figures.py::test_ttft_by_turn",
    "python benchmarks/ttft_by_turn.py results/sessions": "tests/docs/test_figures.py::test_ttft_by_turn",
    "batchlab run configs/prefix.yaml --set strategies=[continuous] --set continuous.prefix_caching=true":
        "tests/docs/test_figures.py::test_shared_system_prompts",
    "batchlab tune --set backend.linear='{step_ms: 25, per_seq_ms: 0.4}' --set traffic.rates=[40] "
    "--set traffic.prompt_len=16 --set traffic.output_len=200 --set strategies=[continuous] --slo tpot_p95=60ms":
        "tests/docs/test_figures.py::test_the_tuner_example",
    "batchlab run configs/sim.yaml --executor ray": "tests/run/test_executors.py::test_a_ray_sweep_writes_the_same_bytes_as_a_local_one",
    "batchlab capacity configs/sim.yaml --high 100 --executor ray":
        "tests/tune/test_capacity.py::test_on_ray_the_search_takes_fewer_rounds_to_the_same_bracket",
    "batchlab compare results/before results/after --out results/compare":
        "tests/report/test_compare.py::test_two_experiments_side_by_side_at_their_common_rates",
    "python benchmarks/readme_figures.py": "tests/test_readme_figures.py::test_every_page_quotes_exactly_what_the_result_files_hold",
    "python benchmarks/readme_figures.py --check":
        "tests/test_readme_figures.py::test_the_check_command_passes_here_and_fails_on_an_unknown_block",
}


@dataclass
class Run:
    """Commands run here, in order, in one scratch directory."""
    commands: list[str]
    extra: list[list[str]]                             # appended to each command: what shortens it
    check: Callable[[Path, list], None]
    setup: Callable[[Path], None] = field(default=lambda d: None)


def _summary(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


def _azure_trace(d: Path) -> None:
    """A small file in the Azure LLM inference trace format: one request every 5 s for 15 minutes."""
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:{15 + (5 * i) // 60:02d}:{(5 * i) % 60:02d}.6805900,{64 + i % 50},{8 + i % 24}" for i in range(180)]
    (d / "AzureLLMInferenceTrace_conv.csv").write_text("\n".join(rows) + "\n")


def _check_trace(d: Path, done: list) -> None:
    rows = list(csv.DictReader((d / "results" / "latest" / "requests.csv").open()))
    per = {s: sum(r["strategy"] == s for r in rows) for s in {r["strategy"] for r in rows}}
    # the first 600 s of the file, replayed twice as fast: requests at 0, 5, ..., 595 s of the file
    assert per == {"naive": 120, "dynamic": 120, "continuous": 120}, per
    assert max(float(r["arrival_time"]) for r in rows) == pytest.approx(297.5)


def _check_strategies(out: str, strategies: set[str], rates: set[float]) -> Callable[[Path, list], None]:
    def check(d: Path, done: list) -> None:
        rows = _summary(d / out / "summary.csv")
        assert {(r["strategy"], float(r["rate"])) for r in rows} == {(s, r) for s in strategies for r in rates}
        assert all(r["failed"] in ("0", "0.0") for r in rows), [r["failed"] for r in rows]
    return check


def _check_profile(d: Path, done: list) -> None:
    profile = json.loads((d / "a100.json").read_text())
    assert profile["overhead_s"] > 0 and profile["kv_s_per_token"] > 0


def _toy_profile(d: Path) -> None:
    """A profile file where the docs expect the tiny model's measured one (`batchlab profile` of a
    preset writes the same format in a second)."""
    p = sh("batchlab profile --preset toy --out prof_iter.json", d)
    assert p.returncode == 0, p.stderr


def _check_tune(d: Path, done: list) -> None:
    assert "verdict:" in done[-1].stdout and "replica" in done[-1].stdout
    assert json.loads((d / "tune" / "tune.json").read_text())["closed_form"]["cap"] > 0


def _check_size(out: str, replicas: int | None = None, cap: int | None = None):
    def check(d: Path, done: list) -> None:
        pick = json.loads((d / out / "size.json").read_text())["pick"]
        assert pick is not None and pick["holds"] and "pick:" in done[-1].stdout
        assert replicas is None or (pick["replicas"], pick["cap"]) == (replicas, cap)
    return check


def _check_catalog(d: Path, done: list) -> None:
    assert "H100-SXM" in done[-1].stdout and "roofline estimates" in done[-1].stdout


def _check_priced(d: Path, done: list) -> None:
    row = _summary(d / "priced" / "summary.csv")[0]
    assert float(row["usd_per_m_tokens"]) > 0 and int(row["gpus"]) == 4


def _check_four_modes(d: Path, done: list) -> None:
    modes = json.loads((d / "docs" / "results" / "four_modes.json").read_text())["workloads"]["40"]
    assert len(modes) == 6 and modes["continuous"]["finished"] == 40


def _check_grouping(d: Path, done: list) -> None:
    data = json.loads((d / "docs" / "results" / "length_grouping.json").read_text())
    assert [r["rate"] for r in data["rates"]] == [20, 40] and data["skip_sweep"][1]["max_skips"] == 32


def _check_roofline(d: Path, done: list) -> None:
    assert "roofline" in done[-1].stdout and "Mistral-7B on an RTX 3090" in done[-1].stdout


SHORT = ["--set", "traffic.duration_s=5", "--set", "traffic.warmup_s=1", "--set", "report=false", "--quiet"]
RUN = {
    "gpu catalog": Run(["batchlab size --list-gpus"], [[]], _check_catalog),
    "size, linear": Run(["batchlab size configs/size-linear.yaml --slo tpot_p95=60ms"],
                        [["--set", "traffic.duration_s=60", "--set", "traffic.warmup_s=15", "--out", "size"]],
                        _check_size("size", 6, 87)),
    "size, catalog": Run(["batchlab size configs/size-llama3-70b.yaml"],
                         [["--set", "traffic.duration_s=120", "--gpus", "H100-SXM,A100-80GB", "--tp", "4,8",
                           "--out", "size70"]], _check_size("size70")),
    "priced run": Run(["batchlab run configs/size-llama3-70b.yaml"],
                      [["--set", "traffic.rates=[1]", "--out", "priced", *SHORT]],
                      _check_priced),
    "roofline check": Run(["python benchmarks/roofline_check.py"], [[]], _check_roofline),
    "four modes": Run(["python benchmarks/four_modes.py --json docs/results/four_modes.json"],
                      [["--requests", "40"]], _check_four_modes, lambda d: (d / "docs" / "results").mkdir(parents=True)),
    "length grouping": Run(["python benchmarks/length_grouping.py --json docs/results/length_grouping.json"],
                           [["--rates", "20", "40", "--duration", "30", "--skips", "32"]], _check_grouping,
                           lambda d: (d / "docs" / "results").mkdir(parents=True)),
    "trace replay": Run(
        ["batchlab run --set traffic.arrival=trace --set traffic.trace_file=AzureLLMInferenceTrace_conv.csv "
         "--set traffic.replay.duration_s=600 --set traffic.replay.time_scale=0.5"],
        [["--set", "report=false", "--quiet"]], _check_trace, _azure_trace),
    "prefix config": Run(["batchlab run configs/prefix.yaml --out results/prefix"],
                         [["--set", "traffic.rates=[2]", *SHORT]],
                         _check_strategies("results/prefix", {"naive", "dynamic", "continuous"}, {2.0})),
    "closed loop config": Run(["batchlab run configs/closed-loop.yaml"],
                              [["--set", "traffic.concurrency=[1, 4]", "--out", "closed", *SHORT]],
                              _check_strategies("closed", {"naive", "dynamic", "continuous"}, {1.0, 4.0})),
    "sim config": Run(["batchlab run configs/sim.yaml"], [["--set", "traffic.rates=[5]", "--out", "sim", *SHORT]],
                      _check_strategies("sim", {"naive", "dynamic", "continuous"}, {5.0})),
    "smoke config": Run(["batchlab run configs/smoke.yaml --out results/smoke"],
                        [["--set", "traffic.rates=[4]", "--set", "traffic.duration_s=2", "--set", "traffic.warmup_s=0",
                          "--set", "report=false", "--quiet"]],
                        _check_strategies("results/smoke", {"naive", "dynamic", "continuous"}, {4.0})),
    "preset profile": Run(["batchlab profile --preset llama2-7b-a100 --out a100.json"], [[]], _check_profile),
    "tune on a profile": Run(
        ["batchlab tune --set backend.profile=prof_iter.json --set traffic.rates=[30] --set strategies=[continuous] "
         "--set traffic.prompt_len='{dist: uniform, low: 16, high: 64}' "
         "--set traffic.output_len='{dist: uniform, low: 16, high: 64}' --slo tpot_p95=15ms --slo ttft_p99=500ms"],
        [["--set", "traffic.duration_s=10", "--set", "traffic.warmup_s=2", "--out", "tune"]], _check_tune, _toy_profile),
}


def _run_here() -> dict[str, str]:
    return {c: name for name, run in RUN.items() for c in run.commands}


def test_every_command_is_run_or_says_what_it_needs():
    covered = set(ELSEWHERE) | set(_run_here())
    loose = [f"{c.page}:{c.line}: {c.text}" for c in all_commands() if not c.needs and c.text not in covered]
    assert not loose, ("commands no test runs and no `# needs: ...` marker explains (see docs/contributing.md):\n"
                       + "\n".join(loose))


def test_markers_are_known():
    unknown = [f"{c.page}:{c.line}: needs {n}" for c in all_commands() for n in c.needs if n not in MARKERS]
    assert not unknown, f"unknown markers (known: {', '.join(MARKERS)}):\n" + "\n".join(unknown)


def test_no_entry_outlives_its_command():
    shown = {c.text for c in all_commands()}
    stale = [c for c in [*ELSEWHERE, *_run_here()] if c not in shown]
    assert not stale, "entries for commands no page shows any more:\n" + "\n".join(stale)
    marked = {c.text for c in all_commands() if c.needs}
    assert not marked & (set(ELSEWHERE) | set(_run_here())), "a command both marked and run: drop one"


def test_each_named_test_exists():
    for command, where in ELSEWHERE.items():
        path, _, name = where.partition("::")
        text = (ROOT / path).read_text()
        found = re.search(rf"^(async )?def {re.escape(name)}\(", text, re.M) if path.endswith(".py") else name in text
        assert found, f"{command!r}: {where} not found"


def test_the_extraction_joins_continuations_and_reads_markers(tmp_path):
    from tests.docs.shell import commands
    page = tmp_path / "page.md"
    page.write_text("text\n```bash\n# a comment line\nbatchlab run \\\n    --set a='x # y'   # why; needs: gpu, long\n"
                    "make run   # plain comment\n```\n```text\nnot a command\n```\n")
    got = [(c.line, c.text, c.needs) for c in commands(page)]
    assert got == [(4, "batchlab run --set a='x # y'", ("gpu", "long")), (6, "make run", ())]


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.hf] if "smoke" in n else []) for n in RUN])
def test_run_the_command_as_shown(name, tmp_path):
    run = RUN[name]
    if "smoke" in name:
        pytest.importorskip("transformers")
    d = scratch(tmp_path)
    run.setup(d)
    done = []
    for command, extra in zip(run.commands, run.extra, strict=True):
        p = sh(command, d, extra)
        assert p.returncode == 0, f"{command}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        done.append(p)
    run.check(d, done)


def test_every_code_fence_is_closed():
    """An unclosed fence swallows the page after it (and hides its commands from the tests above)."""
    from tests.docs.shell import PAGES
    odd = [str(p.relative_to(ROOT)) for p in PAGES
           if sum(line.lstrip().startswith("```") for line in p.read_text().splitlines()) % 2]
    assert not odd, f"pages with an unclosed code fence: {odd}"
