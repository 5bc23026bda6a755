"""Traffic classes and tenants (traffic.classes): per-class latency, SLO attainment and goodput,
fairness across tenants, the report's section and plot, and the verdict's per-class sentence.

Reads requests.csv rows (report/load.py) and the recorded config only. As everywhere, warm-up rows
are left out and a failed request counts as an infinite latency (core/metrics.py). A class's SLO
is its own `slo` where it has one, else the run's.
Fairness is Jain's index over tenants of the service each received in the measured window divided
by its max-min fair share of all service given (core/metrics.tenant_fairness). Service is counted
in VTC's weighted tokens (the vtc section's weights): a prompt's tokens at its first token, output
tokens spread evenly between first and last token.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.core.metrics import percentile, tenant_fairness
from batchlab.report import fmt
from batchlab.run.strategies import info

METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "e2e_mean", "e2e_p99", "slo_met", "goodput")
COLUMNS = ["strategy", "rate", "repeat", "class", "requests", "failed", *METRICS]


def has_classes(rows: pd.DataFrame | None) -> bool:
    return rows is not None and "class" in rows and rows["class"].notna().any()


def _slos(config: dict) -> dict[str, dict]:
    run = {k: v for k, v in (config.get("slo") or {}).items() if v}
    classes = (config.get("traffic") or {}).get("classes") or []
    return {c["name"]: {k: v for k, v in (c.get("slo") or run).items() if v} for c in classes}


def _window(config: dict) -> tuple[float, float]:
    t = config.get("traffic") or {}
    start = float(t.get("warmup_s", 0.0))
    return start, start + float(t.get("duration_s", 0.0))


def _met(rows: pd.DataFrame, slos: dict[str, dict]) -> np.ndarray:
    """Per row: finished and within its own class's SLO (NaN where the class has none)."""
    ok = (rows["status"] == "finished").to_numpy()
    for key in ("ttft", "tpot", "e2e"):
        limit = rows["class"].map(lambda k, key=key: slos.get(k, {}).get(f"{key}_s", np.inf)).to_numpy(dtype=float)
        ok = ok & (rows[key].fillna(np.inf).to_numpy() <= limit)
    has = rows["class"].map(lambda k: bool(slos.get(k))).to_numpy()
    return np.where(has, ok, np.nan)


def class_table(rows: pd.DataFrame, config: dict, by: str = "class") -> pd.DataFrame:
    """One row per (strategy, rate, repeat, class) (or tenant, with by="tenant"); latencies in
    seconds (inf where a percentile reaches failed requests), slo_met a share, goodput requests
    meeting their SLO per second; each request is held to its own class's SLO."""
    if not has_classes(rows):
        return pd.DataFrame(columns=COLUMNS)
    slos, (start, end) = _slos(config), _window(config)
    sel = rows[rows["class"].notna() & (rows["warmup"] != 1)].copy()
    sel["met"] = _met(sel, slos)
    out = []
    for (s, rate, rep, k), part in sel.groupby(["strategy", "rate", "repeat", by], sort=True):
        failed = (part["status"] != "finished").to_numpy()
        lat = {m: np.where(failed, np.inf, part[m].to_numpy(dtype=float)) for m in ("ttft", "tpot", "e2e")}
        met = part["met"].dropna().to_numpy()
        out.append({"strategy": s, "rate": float(rate), "repeat": int(rep), "class": k, "requests": len(part),
                    "failed": int(failed.sum()),
                    "ttft_p50": float(percentile(lat["ttft"], 50)), "ttft_p99": float(percentile(lat["ttft"], 99)),
                    "tpot_p50": float(percentile(lat["tpot"], 50)), "e2e_mean": float(np.mean(lat["e2e"])),
                    "e2e_p99": float(percentile(lat["e2e"], 99)),
                    "slo_met": float(met.mean()) if met.size else float("nan"),
                    "goodput": float(met.sum() / (end - start)) if met.size and end > start else float("nan")})
    return pd.DataFrame(out, columns=COLUMNS)


def fairness_table(rows: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Jain's index over tenants per (strategy, rate, repeat); empty with fewer than two tenants."""
    cols = ["strategy", "rate", "repeat", "tenants", "jain"]
    if not has_classes(rows) or rows["tenant"].nunique() < 2:
        return pd.DataFrame(columns=cols)
    vtc = config.get("vtc") or {}
    wp, wq = float(vtc.get("prefill_weight", 1.0)), float(vtc.get("decode_weight", 2.0))
    start, end = _window(config)
    out = []
    for (s, rate, rep), part in rows[rows["tenant"].notna()].groupby(["strategy", "rate", "repeat"], sort=True):
        first, last = part["first_token_time"].to_numpy(float), part["completion_time"].to_numpy(float)
        n = part["output_len"].fillna(0).to_numpy(float)
        prefill = np.where((first >= start) & (first < end), wp * part["prompt_len"].to_numpy(float), 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            inside = (np.minimum(last, end) - np.maximum(first, start)) / (last - first)
            share = np.where(last > first, np.clip(inside, 0, 1), ((last >= start) & (last < end)).astype(float))
        got = prefill + wq * n * np.nan_to_num(share)
        arrived = (part["arrival_time"] >= start) & (part["arrival_time"] < end)
        asked = wp * part["prompt_len"] + wq * part["max_new_tokens"]
        tenants = part["tenant"].to_numpy()
        received = pd.Series(got).groupby(tenants).sum().to_dict()
        demanded = asked[arrived].groupby(tenants[arrived.to_numpy()]).sum().to_dict()
        if len(demanded) >= 2:
            out.append({"strategy": s, "rate": float(rate), "repeat": int(rep), "tenants": len(demanded),
                        "jain": tenant_fairness(received, demanded)})
    return pd.DataFrame(out, columns=cols)


def _median(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return table.groupby(by, sort=False).agg({m: "median" for m in METRICS} | {"requests": "sum", "failed": "sum"})


def class_lines(rows: pd.DataFrame | None, config: dict, table: pd.DataFrame | None) -> list[str]:
    """report.md's "Classes and tenants" section from the rows and their `class_table`; nothing
    for traffic without classes (table None)."""
    if table is None or not has_classes(rows):
        return []
    pairs = rows[["class", "tenant"]].dropna().drop_duplicates()
    shared = pairs.groupby("tenant")["class"].nunique().max() > 1      # some tenant sends several classes
    by_tenant = class_table(rows, config, by="tenant") if shared else None
    fair = fairness_table(rows, config)
    md = ["## Classes and tenants", "", "Per traffic class (median over repeats; failed requests count as "
          "infinite latency; SLO met and goodput against the class's own SLO where it has one).", ""]
    for rate, part in table.groupby("rate", sort=True):
        md += [f"**{fmt.rate(float(rate))}**", ""] + _class_rows(part, "class")
        if by_tenant is not None:
            md += ["Per tenant (each request against its own class's SLO):", ""]
            md += _class_rows(by_tenant[by_tenant["rate"] == rate], "tenant")
    if not fair.empty:
        md += ["Fairness across tenants: Jain's index of each tenant's service over its max-min fair share "
               "(1 = every tenant got its fair share; service in VTC's weighted tokens), median over repeats.", "",
               "| strategy | " + " | ".join(fmt.rate(float(r)) for r in sorted(fair["rate"].unique())) + " |",
               "|---" * (1 + fair["rate"].nunique()) + "|"]
        for s, part in fair.groupby("strategy", sort=False):
            by_rate = part.groupby("rate")["jain"].median()
            md.append(f"| {s} | " + " | ".join(f"{by_rate[r]:.3f}" if r in by_rate else fmt.DASH
                                              for r in sorted(fair["rate"].unique())) + " |")
        md.append("")
    return md


def _class_rows(part: pd.DataFrame, label: str) -> list[str]:
    med = _median(part, ["strategy", "class"]).reset_index()
    md = [f"| strategy | {label} | requests | failed | p50 TTFT | p99 TTFT | p50 TPOT | mean E2E | p99 E2E | SLO met | goodput |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for _, r in med.iterrows():
        cells = [_sec(r[m]) for m in ("ttft_p50", "ttft_p99", "tpot_p50", "e2e_mean", "e2e_p99")]
        slo = fmt.DASH if np.isnan(r["slo_met"]) else f"{100 * r['slo_met']:.0f} %"
        good = fmt.DASH if np.isnan(r["goodput"]) else f"{r['goodput']:.3g} req/s"
        md.append(f"| {r['strategy']} | {r['class']} | {int(r['requests'])} | {int(r['failed'])} | "
                  + " | ".join(cells) + f" | {slo} | {good} |")
    return md + [""]


def _sec(v: float) -> str:
    return "failed" if np.isinf(v) else (fmt.DASH if np.isnan(v) else fmt.seconds(float(v)))


def policy_pairs(strategies: list[str]) -> list[tuple[str, str]]:
    """(policy, the strategy it is compared with) for every policy run beside that strategy
    (priority, sjf, vtc and your own beside FCFS continuous batching)."""
    return [(s, info(s).compared_with) for s in strategies if info(s).compared_with in strategies]


def class_verdict(table: pd.DataFrame | None, strategies: list[str], rate: float) -> list[str]:
    """One sentence per policy against FCFS continuous at `rate`: the class whose p99 TTFT it
    cut most and what the class it hurt most paid, e.g. "priority cut p99 TTFT of class
    `interactive` by 85% (1.2 s -> 180 ms) at 20 req/s, at a cost of +12% for `batch`"."""
    if table is None or table.empty:
        return []
    med = _median(table, ["strategy", "rate", "class"])
    out = []
    for a, b in policy_pairs(strategies):
        try:
            mine, base = med.loc[(a, float(rate))]["ttft_p99"], med.loc[(b, float(rate))]["ttft_p99"]
        except KeyError:
            continue
        change = {k: _change(mine[k], base[k]) for k in mine.index if k in base.index}
        change = {k: v for k, v in change.items() if v is not None}
        if not change:
            continue
        best, worst = min(change, key=change.get), max(change, key=change.get)
        if abs(change[best]) < 0.05 and abs(change[worst]) < 0.05:
            out.append(f"{a} left every class's p99 TTFT within 5% of FCFS continuous batching at {fmt.rate(rate)}.")
            continue
        text = (f"{a} {'cut' if change[best] < 0 else 'raised'} p99 TTFT of class `{best}` by "
                f"{abs(change[best]):.0%} ({_sec(base[best])} → {_sec(mine[best])}) at {fmt.rate(rate)} "
                "against FCFS continuous batching")
        if worst != best and change[worst] > 0.05:
            text += f", at a cost of +{change[worst]:.0%} for `{worst}` ({_sec(base[worst])} → {_sec(mine[worst])})"
        out.append(text + ".")
    return out


def _change(new: float, old: float) -> float | None:
    if not (np.isfinite(new) and np.isfinite(old)) or old <= 0:
        return None
    return new / old - 1


def class_figure(table: pd.DataFrame | None, out: Path, rate: float) -> Path | None:
    """p99 TTFT per class, one bar per strategy, at `rate` (median over repeats)."""
    if table is None or table.empty:
        return None
    from batchlab.report.plots import STYLE, color, log_axis, plt, save
    med = _median(table, ["strategy", "rate", "class"]).reset_index()
    med = med[med["rate"] == float(rate)]
    if med.empty:
        return None
    classes, strategies = list(dict.fromkeys(med["class"])), list(dict.fromkeys(med["strategy"]))
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(classes) * len(strategies) / 2), 4.2))
        width = 0.8 / len(strategies)
        for i, s in enumerate(strategies):
            vals = [med[(med["strategy"] == s) & (med["class"] == k)]["ttft_p99"] for k in classes]
            ys = [float(v.iloc[0]) if len(v) else np.nan for v in vals]
            xs = np.arange(len(classes)) + (i - (len(strategies) - 1) / 2) * width
            finite = [y if np.isfinite(y) else np.nan for y in ys]
            ax.bar(xs, finite, width, label=s, color=color(s))
            for x, y in zip(xs, ys):
                if np.isinf(y):
                    ax.annotate("failed", (x, 0.02), xycoords=("data", "axes fraction"), ha="center", va="bottom",
                                rotation=90, fontsize=9)
        ax.set_xticks(np.arange(len(classes)), classes)
        log_axis(ax)                       # a policy moves one class by orders of magnitude
        ax.set_ylabel("p99 TTFT (s, log scale)")
        ax.set_title(f"p99 TTFT by traffic class at {fmt.rate(float(rate))}")
        ax.legend(title="strategy")
        return save(fig, out / "classes.png")
