"""What `batchlab tune` tells the user: the report lines on the terminal and tune.json.

The report reads top-down like the sizing recipe it checks: the step-time model and the SLO, the closed
form's arithmetic, the simulator's verdict on that setting, the searched cap and each replica count
tried at the target traffic, then one verdict line with the knob to set (or a hint when nothing
held). tune.json holds the same numbers, every simulated point with its SLO checks.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from batchlab.schedulers import scheduler_class
from batchlab.tune.simulate import SimPoint
from batchlab.tune.target import mean_length

if TYPE_CHECKING:
    from batchlab.tune.search import TuneResult


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def _slo_text(slos: dict[str, float]) -> str:
    return ", ".join(f"{k} <= {_ms(v)}" for k, v in slos.items()) or "none"


def _point_text(p: SimPoint, slos: dict[str, float]) -> str:
    got = ", ".join(f"{k} {_ms(p.summary[k])}" + (" ok" if p.slo_ok.get(k) else " BREACH") for k in slos)
    sat = "" if p.saturated_req_s != p.saturated_req_s else (
        f"; {p.rate:g} req/s {'below' if p.rate < p.saturated_req_s else 'AT OR ABOVE'} the "
        f"{p.saturated_req_s:.4g} req/s served saturated")
    return (f"{p.replicas} replica(s): {got}; served {100 * p.served_ratio:.0f}% of offered tokens{sat}"
            f" -> {'holds' if p.holds else 'fails'}")


def report_lines(res: TuneResult) -> list[str]:
    return _closed_form_lines(res) + _simulated_lines(res) + [_verdict_line(res)]


def _closed_form_lines(res: TuneResult) -> list[str]:
    cf, t = res.closed, res.target
    return [
        f"model: {res.cost.description or res.cost.name}; decode step t(b) = {cf.fixed_ms:.2f} + {cf.per_seq_ms:.3f} b ms "
        f"at mean prompt {mean_length(t.prompt_len):.0f}, output {mean_length(t.output_len):.0f} tokens",
        f"SLO: {_slo_text(t.slos)}; traffic {t.qps:g} req/s",
        "closed form (arithmetic on the step-time model):",
        f"  budget {cf.budget_ms:g} ms/token -> max batch {cf.cap} (step {cf.step_ms:.1f} ms; limited by {cf.limited_by})"
        if cf.budget_ms is not None else f"  no TPOT budget -> batch {cf.cap} (limited by {cf.limited_by})",
        f"  one replica: {cf.cap} / {cf.step_ms:.1f} ms = {cf.tok_s_per_replica:.0f} tok/s; need {t.qps:g} x "
        f"{mean_length(t.output_len):.0f} = {cf.need_tok_s:.0f} tok/s -> {cf.replicas} replicas",
    ]


def _simulated_lines(res: TuneResult) -> list[str]:
    cf, t = res.closed, res.target
    knob = t.knob
    lines = [
        f"simulated, closed-form setting ({knob}={cf.cap}, {cf.replicas} replicas, {t.router}, {t.duration_s:g} s of "
        f"{t.arrival} traffic): " + _point_text(res.closed_check, t.slos),
        f"simulated search (1 replica, saturated, caps {res.sweep[0].cap}..{res.sweep[-1].cap}): {knob}={res.cap} "
        f"({res.cap_reason})",
    ]
    return lines + [f"  at {knob}={res.cap}: " + _point_text(p, t.slos) for p in res.replica_runs]


def _verdict_line(res: TuneResult) -> str:
    cf, t = res.closed, res.target
    knob = t.knob
    if res.replicas is None:
        last = res.replica_runs[-1]
        breached = [k for k, ok in last.slo_ok.items() if not ok] or ["keeping up"]
        hint = ("a request-level batch holds new arrivals until it finishes: try --strategy continuous"
                if scheduler_class(t.strategy).level == "request"
                and any(k.split("_")[0] in ("ttft", "queue_wait", "e2e") for k in breached)
                else "shrink the batch or relax the SLO")
        return (f"verdict: no replica count up to {last.replicas} holds {', '.join(breached)} at "
                f"{knob}={res.cap}; {hint}")
    extra = f", dynamic.max_wait_ms={res.max_wait_ms:g}" if res.max_wait_ms is not None else ""
    return (f"verdict: {knob}={res.cap}{extra} with {res.replicas} replicas holds {_slo_text(t.slos)} at "
            f"{t.qps:g} req/s (closed form said {cf.cap} with {cf.replicas})")


def to_json(res: TuneResult) -> dict[str, Any]:
    def point(p: SimPoint) -> dict:
        keep = ("throughput_tok_s", "requests_per_s", "tpot_p50", "tpot_p95", "ttft_p50", "ttft_p99",
                "queue_wait_p99", "finished", "failed")
        return {"cap": p.cap, "replicas": p.replicas, "rate": p.rate, "served_ratio": p.served_ratio,
                "served_tok_s": p.served_tok_s,
                "slo_ok": p.slo_ok, "holds": p.holds, **{k: p.summary.get(k) for k in keep}}
    return {"cost": asdict(res.cost), "target": {**asdict(res.target), "prompt_len": res.target.prompt_len.model_dump(),
                                                 "output_len": res.target.output_len.model_dump()},
            "closed_form": asdict(res.closed), "closed_form_check": point(res.closed_check),
            "sweep": [point(p) for p in res.sweep], "cap": res.cap, "cap_reason": res.cap_reason,
            "replica_runs": [point(p) for p in res.replica_runs], "replicas": res.replicas,
            "max_wait_ms": res.max_wait_ms}
