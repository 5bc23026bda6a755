"""The closed form: batch cap and replica count by arithmetic, before any simulation.

With b sequences running, one decode step costs t(b) = fixed + b x per-sequence cost (the step-time
model at the traffic's mean lengths). The largest cap under a TPOT budget is the largest b with
t(b) <= budget, also bounded by the KV memory a batch of mean-length sequences needs; one replica
then sustains b / t(b) tokens/s, and the traffic needs ceil(qps x output / that) replicas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from batchlab.backends.cost import StepCost
from batchlab.tune.target import BATCH_BOUND, Target, mean_length


@dataclass(frozen=True)
class ClosedForm:
    fixed_ms: float                  # per step, whatever the batch
    per_seq_ms: float                # per running sequence, at the traffic's mean lengths
    budget_ms: float | None          # the TPOT-like budget the cap is sized for
    cap: int                         # largest batch whose step fits the budget (and memory)
    limited_by: str                  # "slo", "memory", "max_cap", or "infeasible"
    step_ms: float                   # t(cap)
    tok_s_per_replica: float         # cap / t(cap)
    need_tok_s: float                # qps x mean output
    replicas: int

    def step(self, b: float) -> float:
        return self.fixed_ms + b * self.per_seq_ms


def step_model(cost: StepCost, p: float, o: float) -> tuple[float, float]:
    """(fixed, per-sequence) seconds of a mean decode step, from the step-time model: each running
    sequence is one decode row reading its KV at the mean context p + o/2, and pays its prompt's
    prefill (and, at worst, a prefill pass of its own) once over o steps."""
    return cost.fixed_s, cost.added_s(p + o / 2, 0, 1) + cost.added_s(0, p, 0) / o


def closed_form(cost: StepCost, target: Target) -> ClosedForm:
    p, o = mean_length(target.prompt_len), mean_length(target.output_len)
    fixed, per_seq = (1e3 * x for x in step_model(cost, p, o))
    budget = tpot_budget_ms(target.slos)
    cap, why = largest_cap(cost, p, o, target.slos, target.max_cap)
    step = fixed + cap * per_seq
    thru = cap / (step / 1e3)
    need = target.qps * o
    replicas = max(1, -(-int(need) // int(thru))) if thru >= 1 else math.ceil(need / thru)  # whole replicas, rounded up
    return ClosedForm(fixed, per_seq, budget, cap, why, step, thru, need, replicas)


def tpot_budget_ms(slos: dict[str, float]) -> float | None:
    """The tightest TPOT-like SLO (what a batch cap controls), milliseconds; None without one."""
    budgets = [v * 1e3 for k, v in slos.items() if k.split("_")[0] in BATCH_BOUND]
    return min(budgets) if budgets else None


def largest_cap(cost: StepCost, p: float, o: float, slos: dict[str, float], max_cap: int) -> tuple[int, str]:
    """The largest batch of mean-length sequences (prompt p, output o) whose step keeps the TPOT
    budget and whose KV fits, and what limits it: "slo", "memory", "max_cap" or "infeasible"."""
    fixed, per_seq = (1e3 * x for x in step_model(cost, p, o))
    mem_cap = max(1, int(cost.kv_budget_bytes // (cost.kv_bytes_per_token * (p + o))))
    cap, why = max_batch_under(lambda b: fixed + b * per_seq, tpot_budget_ms(slos), min(mem_cap, max_cap))
    if why == "limit":
        why = "memory" if mem_cap <= max_cap else "max_cap"
    return cap, why


def max_batch_under(step_ms, budget_ms: float | None, limit: int) -> tuple[int, str]:
    """The largest batch under the budget: grow b while t(b + 1) fits it."""
    if budget_ms is not None and step_ms(1) > budget_ms:
        return 1, "infeasible"
    if budget_ms is None:
        return limit, "limit"
    b = 1
    while b < limit and step_ms(b + 1) <= budget_ms:
        b += 1
    return b, "slo" if b < limit else "limit"


def replicas_for(cf: ClosedForm, cap: int) -> int:
    thru = cap / (cf.step(cap) / 1e3)
    return max(1, -(-int(cf.need_tok_s) // max(1, int(thru))))
