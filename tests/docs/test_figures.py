"""Figures the docs quote from deterministic simulations are what the commands shown print.

A simulated run gives the same numbers on every machine, so each test runs the command a page
shows (at the one rate its figures are quoted for, where the config has several: a trace depends
only on seed, rate and repeat) and checks that the page says exactly what the run printed.
Benchmark figures with a result file are checked by tests/test_readme_figures.py instead.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

from tests.docs.shell import page_text, scratch, sh

QUIET = ["--set", "report=false", "--quiet"]


def run(command: str, d: Path, *extra: str) -> str:
    p = sh(command, d, list(extra))
    assert p.returncode == 0, f"{command}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p.stdout


def summary(path: Path) -> dict[tuple[str, float], dict]:
    return {(r["strategy"], float(r["rate"])): r for r in csv.DictReader(path.open())}


def test_the_burst_table(tmp_path):
    d = scratch(tmp_path)
    out = run("batchlab run configs/burst.yaml", d, "--out", "burst", "--quiet")     # the burst table needs the report
    page = page_text("docs/guides/results.md")
    found = re.findall(r"(\w+) peak queue (\d+) \((\d+) before\), back to its pre-burst p99 TTFT (\d+) s after, "
                       r"(\d+) s violating the SLO", out)
    assert {f[0] for f in found} == {"naive", "dynamic", "continuous"}, out
    for name, peak, before, recovery, violating in found:
        assert f"| {name} | {before} → {peak} | {recovery} s | {violating} s |" in page, name


def ttft_table(out: str, rate: str) -> dict[int, list[str]]:
    """turn -> the row's cells, from ttft_by_turn.py's table for one rate."""
    block = out.split(f"{rate} sessions/s (repeat 0)", 1)[1].split("\n\n", 2)[1]
    rows = [line.strip("|").split("|") for line in block.splitlines() if re.match(r"\| \d", line)]
    return {int(r[0]): [c.strip() for c in r[1:]] for r in rows}


def test_ttft_by_turn(tmp_path):
    d = scratch(tmp_path)
    at = ["--set", "traffic.rates=[0.5]", *QUIET]
    run("batchlab run configs/sessions.yaml --out results/sessions", d, *at)
    plain = run("python benchmarks/ttft_by_turn.py results/sessions", d)
    header = plain.split("| turn |", 1)[1].split("\n", 1)[0]
    strategies = [c.strip() for c in header.strip(" |").split("|")]
    table = ttft_table(plain, "0.5")
    page = page_text("docs/results/prefix-caching.md")
    assert "| turn | " + " | ".join(strategies) + " |" in page
    for turn in (1, 2, 4, 6):
        assert f"| {turn} | " + " | ".join(table[turn]) + " |" in page, turn

    def col(name, turn):
        return table[turn][strategies.index(name)]
    first, last = col("continuous", 1).split()[0], col("continuous", 6).split()[0]
    assert f"({first} → {last} ms)" in page
    assert f"(naive {col('naive', 6).split()[1].strip('()')} sixth turns, continuous {col('continuous', 6).split()[1].strip('()')})" in page

    run("batchlab run configs/sessions.yaml --out cached --set strategies=[continuous] --set continuous.prefix_caching=true", d, *at)
    cached = ttft_table(run("python benchmarks/ttft_by_turn.py cached", d), "0.5")
    off = [col("continuous", t).split()[0] for t in range(1, 7)]
    on = [cached[t][0].split()[0] for t in range(1, 7)]
    assert "| caching off | " + " | ".join(off) + " |" in page and "| caching on | " + " | ".join(on) + " |" in page
    hit = float(summary(d / "cached" / "summary.csv")["continuous", 0.5]["prefix_hit_rate_tokens"])
    assert f"{100 * hit:.0f} % of prompt tokens came from the cache" in page


def test_shared_system_prompts(tmp_path):
    d = scratch(tmp_path)
    command = "batchlab run configs/prefix.yaml --set strategies=[continuous] --set continuous.prefix_caching=true"
    run(command, d, "--out", "on", *QUIET)
    run(command.replace("=true", "=false"), d, "--out", "off", *QUIET)
    off, on = summary(d / "off" / "summary.csv"), summary(d / "on" / "summary.csv")
    ms = lambda s, rate: f"{1e3 * float(s['continuous', rate]['ttft_p50']):.0f}"   # noqa: E731
    hits = [round(100 * float(on["continuous", r]["prefix_hit_rate_tokens"])) for r in (2.0, 5.0, 10.0)]
    served = float(off["continuous", 10.0]["requests_per_s"])
    assert (f"continuous batching without caching holds p50 TTFT at {ms(off, 2.0)} ms (2 req/s) and {ms(off, 5.0)} ms "
            f"(5 req/s) and is past capacity at 10 req/s ({served:.1f} req/s served); with caching, {ms(on, 2.0)}, "
            f"{ms(on, 5.0)} and {ms(on, 10.0)} ms, it keeps up at 10 req/s, and {min(hits)}–{max(hits)} % of prompt "
            "tokens come from the cache") in page_text("docs/results/prefix-caching.md")
    assert float(on["continuous", 10.0]["requests_per_s"]) > served


def tune_figures(out: str) -> dict:
    cap, step = re.search(r"max batch (\d+) \(step ([\d.]+) ms", out).groups()
    tok, need, replicas = re.search(r"= (\d+) tok/s; need \d+ x \d+ = (\d+) tok/s -> (\d+) replicas", out).groups()
    checks = {int(n): (tpot, served) for n, tpot, served in
              re.findall(r"at continuous.max_num_seqs=\d+: (\d+) replica\(s\): tpot_p95 ([\d.]+) ms \w+; served (\d+)%", out)}
    return {"cap": int(cap), "step": step, "tok": int(tok), "need": int(need), "replicas": int(replicas), "checks": checks,
            "verdict": re.search(r"^verdict: .*$", out, re.M).group(0)}


def test_the_tuner_example(tmp_path):
    d = scratch(tmp_path)
    command = ("batchlab tune --set backend.linear='{step_ms: 25, per_seq_ms: 0.4}' --set traffic.rates=[40] "
               "--set traffic.prompt_len=16 --set traffic.output_len=200 --set strategies=[continuous] --slo tpot_p95=60ms")
    f = tune_figures(run(command, d, "--out", "tune"))
    n = f["replicas"]
    page = page_text("docs/results/calibration.md")
    assert (f"cap **{f['cap']}** (step {f['step']} ms), {f['tok']:,} tok/s per replica, {f['need']:,} tok/s needed, "
            f"**{n} replicas**") in page
    tpot, served = f["checks"][n]
    assert served == "100" and f"{n} replicas hold (p95 TPOT {tpot} ms, every offered token served)" in page
    assert f"{n - 1} do not keep up ({f['checks'][n - 1][1]} % served)" in page
    other = tune_figures(run(command, d, "--set", "backend.router=least_outstanding", "--out", "tune-lo"))
    assert (other["cap"], other["replicas"]) == (f["cap"], n) and "Both routers" in page       # "Both routers agree"
