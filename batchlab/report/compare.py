"""`batchlab compare DIR DIR ...`: experiments side by side at their common rates, before and after
a knob change, with the report's paired statistics.

Each results directory is one experiment (its label: the directory's name). Its points join one
table under the name `strategy @ label`, and each strategy is compared, pair by pair, with the same
strategy in the first experiment. The pairs are paired truly, request by request, only when both
experiments replayed the same traces: the same traffic section and seed. So the traffic must match,
and what else differs between the configs is listed first, as the thing being compared. Writes
compare.md, compare.html and the sweep plots into the output directory, never into an input.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError
from batchlab.report import fmt, html, plots, stats
from batchlab.report.load import load_requests, load_results
from batchlab.report.report import _comparisons, _quiet, _tables
from batchlab.run.experiment import flatten

IGNORED = ("rates", "repeats")         # traffic keys that only choose which points ran
NOT_SETTINGS = ("out", "name", "report", "executor")   # keys that say where and how a run went, not what it measured


@dataclass
class Experiment:
    label: str
    path: Path
    summary: pd.DataFrame
    requests: pd.DataFrame | None
    config: dict


def load(dirs: list[Path]) -> list[Experiment]:
    """Each directory's results, labelled by its name (a repeated name gets #2, #3)."""
    if len(dirs) < 2:
        raise ConfigError("compare: give two or more results directories")
    out, seen = [], {}
    for d in dirs:
        summary, _, config = load_results(d)
        name = d.resolve().name
        seen[name] = seen.get(name, 0) + 1
        label = name if seen[name] == 1 else f"{name}#{seen[name]}"
        out.append(Experiment(label, d, summary, load_requests(d), config))
    return out


def differences(exps: list[Experiment]) -> dict[str, list[object]]:
    """Config keys whose values differ between the experiments: key -> each experiment's value."""
    flats = [{k: v for k, v in flatten(e.config) if k.split(".")[0] not in NOT_SETTINGS} for e in exps]
    keys = sorted(set().union(*flats))
    return {k: [f.get(k) for f in flats] for k in keys if len({repr(f.get(k)) for f in flats}) > 1}


def check_same_traffic(exps: list[Experiment]) -> None:
    diff = [k for k in differences(exps) if k.startswith("traffic.") and k.split(".")[1] not in IGNORED]
    if diff:
        raise ConfigError(f"compare: the experiments replayed different traffic ({', '.join(diff[:4])} differ), so no "
                          "request can be paired with its twin; compare runs of the same traffic section")


def combined(exps: list[Experiment]) -> tuple[pd.DataFrame, pd.DataFrame | None, list[float]]:
    """Every experiment's points at the rates all of them ran, strategies named `strategy @ label`."""
    common = sorted(set.intersection(*(set(e.summary["rate"].astype(float)) for e in exps)))
    if not common:
        raise ConfigError("compare: the experiments share no rate: "
                          + "; ".join(f"{e.label} ran {', '.join(fmt.num(r) for r in sorted(e.summary['rate'].unique()))}"
                                      for e in exps))
    name = lambda e: (lambda s: f"{s} @ {e.label}")  # noqa: E731
    summaries = [e.summary[e.summary["rate"].isin(common)].assign(strategy=lambda d, e=e: d["strategy"].map(name(e)))
                 for e in exps]
    requests = None
    if all(e.requests is not None for e in exps):
        requests = pd.concat([e.requests[e.requests["rate"].isin(common)].assign(
            strategy=lambda d, e=e: d["strategy"].map(name(e))) for e in exps], ignore_index=True)
    return pd.concat(summaries, ignore_index=True), requests, common


def pairs(exps: list[Experiment]) -> list[tuple[str, str]]:
    """Each later experiment's strategy against the same strategy in the first."""
    first = set(exps[0].summary["strategy"])
    return [(f"{s} @ {e.label}", f"{s} @ {exps[0].label}") for e in exps[1:]
            for s in dict.fromkeys(e.summary["strategy"]) if s in first]


def headline(cmp: pd.DataFrame, a: str, b: str) -> str:
    """One line per pair: each metric's change at each common rate, ✓ where its interval excludes 0."""
    if cmp.empty:
        return f"{a} vs {b}: no repeat in common"
    parts = []
    for rate, rows in cmp.groupby("rate"):
        bits = [f"{stats_name(r['metric'])} {fmt.change(r['rel'])}{' ✓' if r['supported'] else ''}"
                for _, r in rows.iterrows()]
        parts.append(f"at {fmt.rate(rate)}: " + ", ".join(bits))
    return f"{a} against {b}: " + "; ".join(parts)


def stats_name(metric: str) -> str:
    return {"throughput_tok_s": "throughput", "goodput": "goodput"}.get(metric, metric.replace("_", " "))


def build_compare(dirs: list[Path], out: Path) -> tuple[Path, list[str]]:
    exps = load(dirs)
    if any(out.resolve() == e.path.resolve() for e in exps):
        raise ConfigError(f"compare: --out {out} is one of the experiments; write the comparison elsewhere")
    check_same_traffic(exps)
    summary, requests, common = combined(exps)
    seed = int(summary["seed"].dropna().iloc[0]) if summary["seed"].notna().any() else 0
    with _quiet():
        comparisons = {p: stats.compare(summary, requests, *p, seed=seed) for p in pairs(exps)}
    lines = [headline(c, *p) for p, c in comparisons.items()]
    slo = {k: v for k, v in (exps[0].config.get("slo") or {}).items() if v}
    out.mkdir(parents=True, exist_ok=True)
    with plots.distinct_colors(list(dict.fromkeys(summary["strategy"]))):
        figs = [plots.plot_tradeoff(summary, out, slo, {}, {}), plots.plot_latency_vs_rate(summary, out, slo)]
    md = [f"# batchlab comparison: {', '.join(e.label for e in exps)}", ""] + [f"- {line}" for line in lines] + [""]
    md += ["## What differs", "", "| key | " + " | ".join(e.label for e in exps) + " |", "|---|" + "---|" * len(exps)]
    md += [f"| {k} | " + " | ".join(f"`{v}`" for v in vals) + " |" for k, vals in differences(exps).items()
           if not k.startswith("traffic.")] + [""]
    md += [f"Common rates: {', '.join(fmt.rate(r) for r in common)}; directories: "
           + ", ".join(f"{e.label} = `{e.path}`" for e in exps) + ".", ""]
    md += ["## Plots", ""] + [x for f in figs for x in (f"![{f.stem}]({f.name})", "")]
    md += _tables(summary, {}) + _comparisons(comparisons)
    path = out / "compare.md"
    write_atomic(path, "\n".join(md) + "\n")
    html.write_html(path)
    return path, lines
