"""Where a request's time went, and the one place a request is finished.

A finished request's E2E splits into phases that add up to it exactly:
  wait_busy      queued while the backend ran an earlier request-level batch
  wait_trigger   queued with the backend idle, until a size / age / memory trigger fired
  wait_capacity  queued for a slot or KV blocks (iteration level, or a server's own queue)
  prefill        scheduled until the first token, less stalls
  decode         first to last token, less stalls
  stall          step time spent on other requests' prompt tokens, and gaps after a preemption
Every phase is written through the functions here, by the driver and by backends that can see
a phase the driver cannot (the simulator's stalls, a batching manager's own queue).
"""
from __future__ import annotations

from batchlab.core.request import Request, Status

PHASES = ("wait_busy", "wait_trigger", "wait_capacity", "prefill", "decode", "stall")
# NOTE: the share of "stall" that fell before the first token; moved out of "prefill" at finish.
_STALL_BEFORE_FIRST = "stall_prefill"


def charge_launch(batch: list[Request], launched_at: float, idle_since: float) -> None:
    """A request-level batch launched: split each request's queueing into the time the backend
    was busy with an earlier batch and the time it waited for a trigger."""
    for r in batch:
        r.add_time("wait_busy", min(launched_at, idle_since) - r.arrival_time)
        r.add_time("wait_trigger", launched_at - max(r.arrival_time, idle_since))


def charge_stall(r: Request, seconds: float, before_first_token: bool = False) -> None:
    """`seconds` of r's time were spent on other requests' work (their prefill, a preemption)."""
    if seconds > 0:                            # Request.add_time, inlined: called for every request
        b = r.breakdown
        b["stall"] = b.get("stall", 0.0) + seconds
        if before_first_token:
            b[_STALL_BEFORE_FIRST] = b.get(_STALL_BEFORE_FIRST, 0.0) + seconds


def finish(r: Request, queued_as: str | None = None) -> None:
    """The one place a request becomes FINISHED: it must have exactly `max_new_tokens` tokens,
    or it fails saying so. `queued_as` names the phase its whole queueing time goes to (when no
    launch split was charged). Prefill and decode are what is left once stalls are taken out,
    so the phases add up to E2E; a request with no scheduled stamp (a remote server) has none."""
    if r.output_len != r.max_new_tokens:
        r.breakdown.pop(_STALL_BEFORE_FIRST, None)
        r.fail(f"backend produced {r.output_len} tokens, expected {r.max_new_tokens}")
        return
    r.status = Status.FINISHED
    if r.scheduled_time is None:
        return
    if queued_as is not None:
        r.add_time(queued_as, r.scheduled_time - r.arrival_time)
    first = r.token_times[0]
    stall_prefill = r.breakdown.pop(_STALL_BEFORE_FIRST, 0.0)
    r.add_time("prefill", first - r.scheduled_time - stall_prefill)
    r.add_time("decode", r.token_times[-1] - first - (r.breakdown.get("stall", 0.0) - stall_prefill))
