"""Plots inside one run, rebuilt from requests.csv (see report/timeline.py for the series).

- timeline.png: arrivals, queue depth and running batch size over time, per strategy.
- requests.png: a few consecutive requests as bars: waiting, prefill, decode.
- useful_work.png: rows still decoding at each step of a lockstep batch (idle slots shown), the
  useful decode work sum(o) / (B x max o) and batch sizes across rates.
- breakdown.png: where each strategy's E2E time goes, as a stacked bar per strategy.
- burst.png: queue depth and windowed p99 TTFT around a burst.
A run with nothing to show (no request arrived, none finished) still gets its figure, saying so;
every axis limit comes from finite stamps only.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from batchlab.report import timeline as tl
from batchlab.report.fmt import RATE_UNIT, load_axis, num
from batchlab.report.fmt import rate as rate_text
from batchlab.report.plots import OKABE_ITO, STYLE, color, empty_panel, log_axis, missing_note, plt, save, strategies

# NOTE: one Okabe-Ito colour per phase (two greys were hard to tell apart); the three waits are
# hatched so they read as waiting at a glance. report.py's caption explains each name.
PHASES = [("wait_busy", "waiting for the previous batch", OKABE_ITO["orange"]),
          ("wait_trigger", "waiting for a trigger (size / age / memory / drain)", OKABE_ITO["yellow"]),
          ("wait_capacity", "waiting for KV capacity / a slot", OKABE_ITO["sky"]),
          ("prefill", "prefill", OKABE_ITO["purple"]),
          ("decode", "decode", OKABE_ITO["blue"]),
          ("stall", "stalled by others (their prefill, preemption)", OKABE_ITO["vermillion"])]
WAITS = {"wait_busy", "wait_trigger", "wait_capacity"}


def one_run(requests: pd.DataFrame, rate: float) -> pd.DataFrame:
    return requests[(requests["rate"] == rate) & (requests["repeat"] == 0)]


def finite_values(*columns: pd.Series) -> np.ndarray:
    """The finite numbers in these columns, flattened: a stamp may be missing (failed) or inf."""
    v = np.concatenate([pd.to_numeric(c, errors="coerce").to_numpy(float) for c in columns])
    return v[np.isfinite(v)]


def shade(ax, warmup_s: float, burst: tuple[float, float] | None) -> None:
    ax.axvspan(0, warmup_s, color="0.85", alpha=0.5, lw=0)
    if burst:
        ax.axvspan(*burst, color="#ffbb78", alpha=0.35, lw=0)


def plot_timeline(requests: pd.DataFrame, out: Path, rate: float, warmup_s: float,
                  burst: tuple[float, float] | None = None) -> Path:
    run = one_run(requests, rate)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(3, 1, figsize=(14, 10), sharex=True)
        first = run[run["strategy"] == strategies(run)[0]] if len(run) else run
        stamps = finite_values(run["completion_time"], run["arrival_time"])
        end = float(stamps.max()) if len(stamps) else 1.0
        bins = np.arange(0, np.ceil(end) + 1, 1.0)
        arrivals = pd.to_numeric(first["arrival_time"], errors="coerce")
        axes[0].hist(arrivals[np.isfinite(arrivals)], bins=bins, color="0.4")
        if run.empty:
            for ax in axes:
                empty_panel(ax, f"no requests at {rate_text(rate)}")
        axes[0].set_ylabel("arrivals per second")
        axes[0].set_title(f"Arrivals (the same trace for every strategy, {rate_text(rate)} mean)")
        for s in strategies(run):
            rows = run[run["strategy"] == s]
            for ax, series in ((axes[1], tl.queue_depth(rows)), (axes[2], tl.running(rows))):
                t, n = series
                ax.step(np.r_[0, t], np.r_[0, n], where="post", color=color(s), lw=1.6, label=s)
        axes[1].set_ylabel("requests waiting")
        axes[1].set_title("Queue depth: arrived, not yet scheduled")
        axes[2].set_ylabel("requests running")
        axes[2].set_title("Running batch size (a lockstep row keeps its slot until its batch ends)")
        axes[2].set_xlabel("time since the run started (s)")
        for ax in axes:
            shade(ax, warmup_s, burst)
        if len(run):
            axes[1].legend(loc="upper left")
        note = "grey band: warm-up, excluded from metrics" + ("; orange band: burst" if burst else "")
        fig.suptitle(f"Timeline of one run at {rate_text(rate)} ({note})", y=1.0)
        fig.tight_layout()
        return save(fig, out / "timeline.png")


_STAMPS = ["arrival_time", "scheduled_time", "first_token_time", "completion_time"]


def plot_requests(requests: pd.DataFrame, out: Path, rate: float, warmup_s: float, n: int = 20) -> Path:
    """Per-request bars for n consecutive requests after warm-up, the same ones for every strategy."""
    run = one_run(requests, rate)
    ids = (run[run["arrival_time"] >= warmup_s].drop_duplicates("request_id")
           .sort_values("arrival_time")["request_id"].head(n).tolist())
    names = strategies(run) or strategies(requests) or ["no strategy ran"]
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(names), 1, figsize=(14, 1.5 + 0.18 * n * len(names)), sharex=True, squeeze=False)
        sel = run[run["request_id"].isin(ids)]
        for ax, s in zip(axes[:, 0], names):
            rows = run[(run["strategy"] == s) & run["request_id"].isin(ids)].set_index("request_id").reindex(ids)
            y = np.arange(len(ids))
            for start, stop, c, label in (("arrival_time", "scheduled_time", OKABE_ITO["grey"], "waiting"),
                                          ("scheduled_time", "first_token_time", OKABE_ITO["purple"], "prefill (to first token)"),
                                          ("first_token_time", "completion_time", OKABE_ITO["blue"], "decode")):
                ax.barh(y, rows[stop] - rows[start], left=rows[start], height=0.7, color=c, label=label)
            ax.plot(rows["arrival_time"], y, "k|", ms=8, label="arrival")
            ax.set_yticks(y[::4], [i for i in ids[::4]], fontsize=8)
            ax.invert_yaxis()
            ax.set_ylabel("request")
            ax.set_title(f"{s}")
            if not ids:
                empty_panel(ax, f"no requests after the {warmup_s:g} s warm-up at {rate_text(rate)}")
            elif rows["completion_time"].isna().all():
                empty_panel(ax, "no requests finished")
        axes[-1, 0].set_xlabel("time since the run started (s)")
        start, end = finite_values(sel["arrival_time"]), finite_values(*(sel[c] for c in _STAMPS))
        if len(start):
            axes[-1, 0].set_xlim(start.min() - 0.3, end.max() + 0.3)
        fig.suptitle(f"{len(ids)} consecutive requests at {rate_text(rate)}: waiting, prefill and decode" if ids
                     else f"No request arrived after the warm-up at {rate_text(rate)}")
        fig.tight_layout(rect=(0, 0, 1, 0.95))
        if ids:
            handles, labels = axes[0, 0].get_legend_handles_labels()
            fig.legend(handles, labels, loc="upper center", ncol=4, bbox_to_anchor=(0.5, 0.965), frameon=False)
        return save(fig, out / "requests.png")


def plot_useful_work(requests: pd.DataFrame, out: Path, rate: float, caps: dict[str, int]) -> Path | None:
    b = tl.batches(requests)
    if b.empty:
        return None
    work = tl.useful_work(b)
    names = [s for s in strategies(requests) if s in set(b["strategy"])]
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(2, 2, figsize=(14, 9.5))
        for ax, s in zip(axes[0], names[:2]):
            _example_batch(ax, requests, b, s, rate)
        for ax in axes[0][len(names[:2]):]:
            ax.set_visible(False)
        for s in names:
            w = work[work["strategy"] == s].sort_values("rate")
            axes[1, 0].plot(w["rate"], 100 * w["useful_decode"], "o-", color=color(s), lw=2, label=f"{s}: decode slots")
            axes[1, 0].plot(w["rate"], 100 * w["prompt_fill"], "s--", color=color(s), lw=1.5, label=f"{s}: prompt (not padding)")
            axes[1, 1].plot(w["rate"], w["mean_batch"], "o-", color=color(s), lw=2, label=f"{s}: mean batch")
            if s in caps:
                axes[1, 1].axhline(caps[s], color=color(s), ls=":", lw=1.5, label=f"{s}: cap {caps[s]}")
        axes[1, 0].set_ylim(0, 105)
        axes[1, 0].set_title("Useful work: Σo / (B × max o) and Σp / (B × max p)")
        axes[1, 0].set_xlabel(load_axis())
        axes[1, 0].set_ylabel("useful share of slots (%)")
        axes[1, 0].legend(fontsize=9)
        axes[1, 1].set_title("Batch size at launch")
        axes[1, 1].set_xlabel(load_axis())
        axes[1, 1].set_ylabel("requests per batch")
        axes[1, 1].legend(fontsize=9)
        fig.suptitle("Useful work in lockstep (request-level) batches; continuous batching has no padded or idle "
                     "rows: a row leaves when done", y=1.0)
        fig.tight_layout()
        lockstep = requests[requests["trigger"].notna()]       # a batch where every row failed has no useful work
        missing_note(fig, {s: set(w["rate"]) for s, w in work.groupby("strategy")},
                     {s: sorted(set(rows["rate"])) for s, rows in lockstep.groupby("strategy", sort=False)})
        return save(fig, out / "useful_work.png")


def _example_batch(ax, requests: pd.DataFrame, b: pd.DataFrame, s: str, rate: float) -> None:
    """The batch of median useful work at this rate: rows still decoding at each step vs B."""
    cand = b[(b["strategy"] == s) & (b["rate"] == rate) & (b["repeat"] == 0)]
    if cand.empty:
        ax.set_visible(False)
        return
    row = cand.iloc[(cand["useful_decode"] - cand["useful_decode"].median()).abs().argsort().iloc[0]]
    rows = one_run(requests, rate)
    members = rows[(rows["strategy"] == s) & (rows["scheduled_time"] == row["scheduled_time"])]
    active = tl.rows_still_decoding(members["output_len"])
    steps = np.arange(1, len(active) + 1)
    size = int(row["size"])
    ax.fill_between(steps, 0, active, step="post", color=color(s), alpha=0.7, label="rows producing a token")
    ax.fill_between(steps, active, size, step="post", color="0.85", hatch="//", edgecolor="0.6",
                    label="idle slots (row done, batch still running)")
    ax.set_ylim(0, size * 1.1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"{s}: one batch at {rate_text(rate)}, B = {size}, useful {100 * row['useful_decode']:.0f}%")
    ax.set_xlabel("decode step")
    ax.set_ylabel("rows in the batch")
    ax.legend(loc="lower left", fontsize=9)


def plot_breakdown(requests: pd.DataFrame, out: Path) -> Path | None:
    """Share of mean E2E per phase, one stacked bar per strategy, one panel per rate (None: no
    request finished after warm-up anywhere). A strategy with none finished at a rate says so."""
    ok = requests[(requests["status"] == "finished") & (requests["warmup"] == 0)]
    if ok.empty:
        return None
    rates = sorted(ok["rate"].unique())
    names = strategies(requests[requests["warmup"] == 0])
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(rates), 1, figsize=(14, 1.2 + 0.55 * len(names) * len(rates) + 0.4 * len(rates)),
                                 squeeze=False, sharex=True)
        for ax, rate in zip(axes[:, 0], rates):
            mean = ok[ok["rate"] == rate].groupby("strategy")[[p for p, _, _ in PHASES]].mean().reindex(names)
            total = mean.sum(axis=1)
            left = np.zeros(len(names))
            for phase, label, c in PHASES:
                share = (100 * mean[phase] / total.where(total > 0)).fillna(0).to_numpy()
                ax.barh(names, share, left=left, color=c, label=label, edgecolor="white", lw=0.5,
                        hatch="//" if phase in WAITS else None)
                left += share
            for i, s in enumerate(names):
                text = (f"mean E2E {total.iloc[i]:.3g} s{_trigger_mix(ok, s, rate)}" if mean.iloc[i].notna().any()
                        else "no requests finished")
                ax.text(101, i, text, va="center", fontsize=10)
            ax.set_xlim(0, 100)
            ax.invert_yaxis()
            ax.set_title(f"{rate_text(rate)}")
            ax.set_ylabel("strategy")
        axes[-1, 0].set_xlabel("share of mean E2E latency (%)")
        axes[0, 0].legend(loc="lower left", bbox_to_anchor=(0, 1.25), ncol=3, frameon=False)
        fig.suptitle("Where the time goes: mean latency breakdown per request", y=1.0)
        fig.tight_layout()
        return save(fig, out / "breakdown.png")


def _trigger_mix(ok: pd.DataFrame, s: str, rate: float) -> str:
    t = ok[(ok["strategy"] == s) & (ok["rate"] == rate)]["trigger"].dropna()
    if t.empty:
        return ""
    share = t.value_counts(normalize=True)
    return "; launched by " + ", ".join(f"{k} {100 * v:.0f}%" if v >= 0.005 else f"{k} <1%" for k, v in share.items())


def plot_burst(requests: pd.DataFrame, out: Path, rate: float, warmup_s: float, burst: tuple[float, float],
               baselines: dict[str, float], window: float, burst_rate: float | None = None) -> Path:
    run = one_run(requests, rate)
    arrivals = finite_values(run["arrival_time"])
    end = float(arrivals.max()) if len(arrivals) else burst[1]
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(2, 1, figsize=(14, 8), sharex=True)
        for s in strategies(run):
            rows = run[run["strategy"] == s]
            t, n = tl.queue_depth(rows)
            axes[0].step(np.r_[0, t], np.r_[0, n], where="post", color=color(s), lw=1.6, label=s)
            edges, p99 = tl.windowed(rows, 0.0, end, window, tl.p99_ttft)
            p99 = np.where(np.isinf(p99), np.nan, p99)   # NOTE: a window where a request failed has no finite p99
            if np.isfinite(p99).any():
                axes[1].step(np.r_[edges, edges[-1] + window], np.r_[p99, p99[-1]], where="post", color=color(s),
                             lw=2, label=f"{s}: p99 per {window:g} s window")
            if np.isfinite(baselines.get(s, np.nan)):
                axes[1].axhline(baselines[s] * tl.RECOVERY_SLACK, color=color(s), ls=":", lw=1.5,
                                label=f"{s}: recovered below {baselines[s] * tl.RECOVERY_SLACK:.3g} s")
        for ax in axes:
            shade(ax, warmup_s, burst)
        axes[0].set_ylabel("requests waiting")
        axes[0].set_title("Queue depth")
        if len(run):
            axes[0].legend(loc="upper right")
        if axes[1].get_lines():
            log_axis(axes[1])
            axes[1].legend(loc="upper center", fontsize=9, ncol=3, bbox_to_anchor=(0.5, -0.16), frameon=False)
        else:
            empty_panel(axes[1])
        axes[1].set_ylabel("p99 TTFT (s, log scale)")
        axes[1].set_title("p99 TTFT of requests arriving in each window (by arrival time)")
        axes[1].set_xlabel("time since the run started (s)")
        drawn = {str(line.get_label()).split(":")[0] for line in axes[1].get_lines()}
        missing_note(fig, {s: {rate} for s in drawn}, {s: [rate] for s in strategies(run)})
        to = f" → {burst_rate:g}" if burst_rate else ""
        fig.suptitle(f"Burst: {num(rate)}{to} {RATE_UNIT.get()} from {burst[0]:g} s to {burst[1]:g} s (orange band); "
                     f"dotted: {tl.RECOVERY_SLACK:g} × each strategy's pre-burst p99 TTFT", y=1.0)
        fig.tight_layout()
        return save(fig, out / "burst.png")
