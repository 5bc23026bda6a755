"""What `batchlab size` says: the ranked settings, the pick, what limits it, and what the next
cheaper settings miss, each failure named by its kind (TTFT, TPOT, E2E, memory, throughput)."""
from __future__ import annotations

import math
from typing import Any

from batchlab.tune.size import Setting, SizeResult

SHOWN = 20                       # table rows printed; size.csv has them all


def limit_kind(reason: str) -> str:
    """A failure's kind, as a buyer reads it."""
    head = reason.split()[0]
    if head in ("TTFT", "TPOT", "ITL", "E2E", "QUEUE"):
        return head if head != "QUEUE" else "queue wait"
    return {"memory:": "memory", "dtype:": "dtype"}.get(head, "throughput")


def usd_per_m_tokens(s: Setting) -> float:
    tok_s = s.figures.get("throughput_tok_s", math.nan)
    return s.usd_per_hour / (3600 * tok_s) * 1e6 if tok_s and tok_s > 0 else math.nan


def _money(res: SizeResult, usd: float) -> str:
    return f"${usd:,.2f}/h" if res.priced else f"{usd:g} GPU-h/h"


def _slo_text(slos: dict[str, float]) -> str:
    return ", ".join(f"{k} <= {v * 1e3:g} ms" if v < 1 else f"{k} <= {v:g} s" for k, v in slos.items())


def report_lines(res: SizeResult) -> list[str]:
    t = res.traffic
    lines = [f"size: {res.strategy} ({res.knob}), {len(t.trace):,} requests at {t.qps:.3g} req/s "
             f"(mean prompt {t.mean_prompt:.0f}, output {t.mean_output:.0f} tokens), SLO {_slo_text(res.slos)}",
             f"  {res.space:,} settings in the search ({len(res.closed_caps)} GPU x TP devices that fit, up to 3 caps "
             f"each, 1 to {res.max_replicas} replicas; {sum(not s.cap for s in res.settings)} that do not fit): "
             f"{len(res.settings)} judged, {sum(s.simulated for s in res.settings)} of them simulated, the rest ruled "
             "out by memory or by the closed form's most tokens/s; every other one costs more than a setting that holds"
             + ("" if res.priced else " (no price set: ranked by GPU count; set backend.usd_per_gpu_hour for dollars)"),
             "", f"  {'device':<16} {'cap':>5} {'repl':>5} {'GPUs':>5} {'cost':>13} "
             f"{'$/M tok' if res.priced else 'GPU-h/M':>8} {'tok/s/GPU':>9}  verdict"]
    ranked = [s for s in res.ranked if s.cap]
    for s in ranked[:SHOWN]:
        verdict = "holds" if s.holds else "fails: " + "; ".join(s.why)
        tok_gpu = s.figures.get("throughput_tok_s", math.nan) / s.gpus
        lines.append(f"  {s.device.label:<16} {s.cap or '-':>5} {s.replicas:>5} {s.gpus:>5} {_money(res, s.usd_per_hour):>13} "
                     f"{usd_per_m_tokens(s):>8.3g} {tok_gpu:>9,.0f}  {verdict}")
    if len(ranked) > SHOWN:
        lines.append(f"  ... {len(ranked) - SHOWN} more in size.csv")
    for kind, says in (("memory", "the weights do not fit"), ("dtype", "no FP8 tensor cores for fp8 weights")):
        unfit = [s.device.label for s in res.settings if not s.cap and s.why[0].startswith(kind)]
        if unfit:
            lines.append(f"  {says} (not simulated): {', '.join(unfit)}")
    if res.skipped:
        lines.append("  not simulated, as even one replica costs more than the pick: "
                     + ", ".join(f"{d} cap {c}" for d, c in res.skipped))
    return lines + [""] + pick_lines(res)


def pick_lines(res: SizeResult) -> list[str]:
    pick = res.pick
    if pick is None:
        kinds = sorted({limit_kind(w) for s in res.settings for w in s.why})
        return [f"pick: none of the settings holds the SLO (they miss on {', '.join(kinds)}); "
                "allow more replicas (--max-replicas), other GPUs, or a looser SLO"]
    cap, why = res.closed_caps[pick.device.label]
    f = pick.figures
    lines = [f"pick: {pick.replicas} replica(s) of {pick.device.label} at {res.knob}={pick.cap}: "
             f"{_money(res, pick.usd_per_hour)} for {pick.gpus} GPU(s), "
             + (f"${usd_per_m_tokens(pick):.3g} per million output tokens, " if res.priced else "")
             + f"{f['throughput_tok_s'] / pick.gpus:,.0f} output tok/s per GPU; served {100 * f['served_share']:.1f} %, "
             + ", ".join(f"{k} {f[k] * 1e3:.0f} ms" for k in res.slos),
             f"  the cap: the closed form's largest full batch is {cap}, limited by "
             + {"slo": "the TPOT budget", "memory": "the KV memory", "max_cap": "--max-cap",
                "infeasible": "nothing: one sequence already misses the TPOT budget"}.get(why, why)]
    lines.append("  to run it: batchlab run CONFIG " + " ".join(f"--set {o}" for o in pick_overrides(res)))
    fewer = sorted((s for s in res.settings if s.device == pick.device and s.replicas == pick.replicas - 1
                    and s.cap), key=lambda s: s.cap)
    if fewer:
        lines.append(f"  {pick.replicas - 1} replica(s) fail: " + "; ".join(
            f"at cap {s.cap}, {', '.join(s.why)} ({', '.join(sorted({limit_kind(w) for w in s.why}))})" for s in fewer))
    cheaper = res.cheaper_failing()
    if cheaper:
        s = cheaper[0]
        lines.append(f"  next cheaper setting: {s.replicas} x {s.device.label} at cap {s.cap} "
                     f"({_money(res, s.usd_per_hour)}, {100 * (1 - s.usd_per_hour / pick.usd_per_hour):.0f} % less) "
                     f"misses: {', '.join(s.why)}")
    near = res.closest_miss()
    if near is not None and (not cheaper or near is not cheaper[0]):
        lines.append(f"  closest cheaper miss: {near.replicas} x {near.device.label} at cap {near.cap} "
                     f"({_money(res, near.usd_per_hour)}): {', '.join(near.why)}")
    own = fewer or cheaper[:1]
    kinds = sorted({limit_kind(w) for s in own for w in s.why} | ({"TPOT"} if why == "slo" else {"memory"} if why == "memory" else set()))
    if kinds:
        lines.append(f"  what limits it: {', '.join(kinds)} (the cap's limit, and what "
                     + ("one replica fewer" if fewer else "the next cheaper setting") + " misses)")
    return lines


def pick_overrides(res: SizeResult) -> list[str]:
    """The --set overrides that make the config run the pick as a sweep point."""
    pick = res.pick
    if pick is None:
        return []
    device = [f"backend.gpu={pick.device.gpu}", f"backend.tp={pick.device.tp}"] if pick.device.gpu else []
    return [*device, f"backend.replicas={pick.replicas}", f"{res.knob}={pick.cap}", f"strategies=[{res.strategy}]"]


def to_json(res: SizeResult) -> dict[str, Any]:
    t = res.traffic
    pick = res.pick
    return {
        "strategy": res.strategy, "knob": res.knob, "slos": res.slos, "priced": res.priced, "space": res.space,
        "judged": len(res.settings), "simulated": sum(s.simulated for s in res.settings),
        "traffic": {"requests": len(t.trace), "qps": t.qps, "mean_prompt": t.mean_prompt, "mean_output": t.mean_output},
        "closed_form_caps": {k: {"cap": c, "limited_by": w} for k, (c, w) in res.closed_caps.items()},
        "pick": None if pick is None else pick.record() | {"usd_per_m_tokens": usd_per_m_tokens(pick),
                                                           "overrides": pick_overrides(res)},
        "cheaper_failing": [s.record() for s in res.cheaper_failing()],
        "closest_miss": None if (near := res.closest_miss()) is None else near.record(),
        "skipped": [{"device": d, "cap": c} for d, c in res.skipped],
        "settings": [s.record() | {"usd_per_m_tokens": usd_per_m_tokens(s)} for s in res.ranked],
    }


def catalog_lines() -> list[str]:
    from batchlab.backends.gpus import CATALOG, EFFICIENCY
    lines = [f"{'gpu':<10} {'memory':>7} {'bandwidth':>10} {'bf16 dense':>11} {'fp8 dense':>10} {'$/GPU-h':>8}  link",]
    for g in CATALOG.values():
        fp8 = f"{g.fp8_flops / 1e12:,.0f} TF" if g.fp8_flops else "-"
        lines.append(f"{g.name:<10} {g.memory_bytes / 1e9:>4.0f} GB {g.mem_bw / 1e12:>7.3f} TB/s {g.flops / 1e12:>8,.0f} TF "
                     f"{fp8:>10} {g.usd_per_hour:>8.2f}  {g.link}")
    return lines + [f"roofline estimates: {EFFICIENCY.source}; prices are editable defaults (backend.usd_per_gpu_hour)"]
