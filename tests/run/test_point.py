from batchlab.core.traffic import TraceItem
from batchlab.run.config import load_config
from batchlab.run.point import run_point
from tests.fakes import UnitStepBackend


class ShortContext(UnitStepBackend):
    def prepare(self, request):
        if request.prompt_len > 100:
            raise ValueError(f"prompt of {request.prompt_len} tokens is longer than the context (100)")


def test_requests_the_backend_refuses_are_recorded_failed_and_the_rest_run():
    cfg = load_config(None, ["traffic.warmup_s=0", "continuous.num_kv_blocks=1000"])
    trace = [TraceItem(0.0, 50, 3), TraceItem(0.5, 500, 3), TraceItem(1.0, 20, 2)]
    res = run_point(cfg, "continuous", 1.0, 0, ShortContext(), trace=trace)
    status = [(r.status.value, r.error) for r in res.requests]
    assert status[0] == ("finished", None) and status[2] == ("finished", None)
    assert status[1][0] == "failed" and "longer than the context" in status[1][1]
    assert res.summary["failed"] == 1 and res.summary["finished"] == 2
