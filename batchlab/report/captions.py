"""What each plot shows, in the words report.md and report.html put under it.

Every name a plot uses is explained here once: the phases of the latency breakdown (the columns
of requests.csv, core/breakdown.py), the triggers that launch a request-level batch (size, age,
memory, drain: schedulers/naive.py and dynamic.py), the knee star and the cross on the trade-off
plot. `{rate}` is filled with the rate the single-run plots show.
"""
from __future__ import annotations

CAPTIONS = {
    "tradeoff": "Throughput against latency (rows: TTFT, TPOT, E2E; columns: p50, p99), one curve per strategy "
                "through the arrival rates; the dash-dot line is the SLO. A curve that turns vertical has reached its "
                "capacity: more load buys no more tokens/s, only waiting. A star marks each strategy's knee (its highest "
                "sustained rate, see Capacity below); a cross marks the next rate up, labelled with what it missed there "
                "(TTFT, TPOT, E2E, or throughput when the queue kept growing).",
    "latency_vs_rate": "TTFT, TPOT and E2E percentiles against the arrival rate.",
    "pareto": "Per-user speed (tokens/s one request sees while decoding, 1 / p50 TPOT) against total output tokens/s, "
              "one curve per strategy through the rates, as vLLM's bench sweep plots it. Up and to the right is better; "
              "the dashed line is the Pareto front: no point tested beats a point on it on both axes.",
    "cost": "What the traffic costs against the latency it gets: $ per million output tokens (the GPUs' price per "
            "hour over the tokens served per hour; a roofline estimate on a catalog GPU) against p99 E2E and p99 TTFT, "
            "one curve per strategy through the rates (labelled). Cost falls with load while the GPUs fill and stops "
            "falling at saturation, where latency climbs: the cheapest point under the SLO line is the cheapest way to "
            "serve it on these GPUs.",
    "cdf": "The full latency distributions at {rate} (the highest rate the best strategy sustains): the further left "
           "and the steeper, the better.",
    "timeline": "One run at {rate}, the best strategy's knee (where the others are most likely past theirs): arrivals, "
                "queue depth and the running batch over time.",
    "requests": "The same consecutive requests under each strategy at the lowest rate: grey is waiting, "
                "purple prefill (to the first token), blue decode.",
    "breakdown": "Where the time goes: each bar splits the mean E2E latency into phases. *waiting for the previous "
                 "batch*: queued while the backend ran an earlier request-level batch. *waiting for a trigger*: queued "
                 "with the backend idle until a launch trigger fired. *waiting for KV capacity / a slot*: queued for a "
                 "sequence slot or KV blocks (continuous batching, or a server's own queue). *prefill*: scheduled until "
                 "the first token. *decode*: first to last token. *stalled by others*: step time spent on other "
                 "requests' prompt tokens, and gaps after a preemption. The text beside a bar names the triggers that "
                 "launched its batches: *size* (the batch reached its cap), *age* (the oldest request waited "
                 "max_wait_ms), *memory* (the next request would exceed the KV memory budget), *drain* (traffic "
                 "ended, so the last partial batch went without waiting to fill).",
    "useful_work": "Lockstep batches decode until their longest row finishes: the hatched area is slots held by rows "
                   "already done. Bottom: useful decode work Σo / (B × max o) and the share of prompt slots that "
                   "are not padding; batch size at launch against each strategy's cap.",
    "burst": "The burst (orange band): queue depth, and the p99 TTFT of requests arriving in each window.",
    "classes": "p99 TTFT of each traffic class under each strategy at {rate} (median over repeats): what a "
               "policy buys one class and what another pays for it. *failed*: the percentile reaches requests "
               "that did not finish.",
}
