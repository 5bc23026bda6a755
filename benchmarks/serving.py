"""One trace, one client, several servers: batchlab serve (naive/dynamic/continuous) vs vLLM vs
transformers serve, on the same local tiny model; plus what `batchlab serve` adds over calling
the same scheduler in-process.

    python benchmarks/serving.py configs/vs-vllm.yaml [--servers batchlab,vllm] [--set strategies=[continuous]]

The rate each server sustains is searched (batchlab/baselines/compare.py; core/search.py), not
read off a grid: from --bracket, widened where it misses the knee, until hi / lo - 1 is within
--tolerance. A point holds when core/sustain.py `judge` says so: no failures, the config's p99
limits met, >= 95 % of the offered tokens served in the measured window, no growing queue. Each
server is searched --sustain-repeats times, restarted each time, in alternating order, after a
burst of --burst requests for its saturated throughput. Servers run one at a time, pinned to core 1
while this load generator has core 0 (vLLM's engine busy-waits). The overhead and load-generator
parts are batchlab/baselines/overhead.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from batchlab.backends import process
from batchlab.baselines import compare, overhead
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default=str(ROOT / "configs" / "vs-vllm.yaml"))
    ap.add_argument("--servers", default="batchlab,vllm,transformers,overhead,loadgen",
                    help=f"any of {', '.join(compare.PARTS)} (comma-separated)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--venv", default=str(ROOT / ".venv-vllm"))
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, s")
    ap.add_argument("--duration", type=float, default=30.0,
                    help="seconds of traffic per point after the warm-up (>= 30 lets a growing queue show)")
    ap.add_argument("--bracket", default="40,80", metavar="LO,HI",
                    help="req/s the first repeat's search starts from (later repeats start from the previous one's)")
    ap.add_argument("--tolerance", type=float, default=compare.TOLERANCE,
                    help="stop when the bracket's hi / lo - 1 is within this")
    ap.add_argument("--max-points", type=int, default=compare.MAX_POINTS,
                    help="points per search at most (0: no search, the saturated burst only)")
    ap.add_argument("--burst", type=int, default=compare.BURST,
                    help="requests sent at once for the saturated throughput (0: not measured)")
    ap.add_argument("--overload", type=float, default=compare.OVERLOAD,
                    help="after each search, one point at this multiple of its sustained rate (0: none)")
    ap.add_argument("--max-queue", type=int, default=compare.UNBOUNDED_QUEUE,
                    help="batchlab serve's queue bound (its own default is 256; here unbounded unless set, as vLLM's)")
    ap.add_argument("--sustain-repeats", type=int, default=3, help="searches per server, in alternating order")
    ap.add_argument("--overhead-rate", type=float, default=2.0, help="low: the overhead, not queueing, is measured")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of the overhead and load-generator measurements")
    ap.add_argument("--json", default=str(ROOT / "docs" / "results" / "serving.json"), help="result file")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="do not pin (default: servers on core 1, this load generator on core 0, because vLLM's "
                         "engine busy-waits on a core and starves a client beside it)")
    return ap.parse_args(argv)


def settings(args: argparse.Namespace) -> compare.Settings:
    try:
        lo, hi = (float(x) for x in args.bracket.split(","))
    except ValueError:
        raise ConfigError(f"--bracket: want LO,HI in req/s, e.g. 40,80 (got {args.bracket!r})") from None
    s = compare.Settings(args.config, args.set, Path(args.venv), args.timeout, (lo, hi), args.tolerance, args.max_points,
                         args.burst, args.sustain_repeats, args.overhead_rate, args.repeats,
                         overload=args.overload, max_queue=args.max_queue)
    compare.check(s, args.servers.split(","))
    return s


@user_errors
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    s = settings(args)
    cfg = load_config(args.config, [*args.set, f"traffic.duration_s={args.duration:g}"])
    s.cpus = process.split_cores(args.pin)
    parts = args.servers.split(",")
    command = " ".join(["python benchmarks/serving.py", *(argv if argv is not None else sys.argv[1:])])
    report, out = compare.header(s, cfg, command.replace(str(ROOT) + "/", "")), Path(args.json)
    compare.carry_over(out, report, parts)
    t = cfg.traffic
    print(f"trace: {t.arrival}, {t.duration_s:g} s per point after {t.warmup_s:g} s warm-up, prompt "
          f"{t.prompt_len.value} / output {t.output_len.value} tokens; {s.sustain_repeats} searches per server "
          f"from {s.bracket[0]:g}-{s.bracket[1]:g} req/s to within {100 * s.tolerance:g} %", flush=True)
    if names := compare.server_names(cfg, parts):
        compare.search_all(s, cfg, names, report, out)
    for part, measure in (("overhead", overhead.overhead), ("loadgen", overhead.loadgen)):
        if part in parts:
            report[part] = measure(s)
            compare.save(report, out)
    compare.save(report, out)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from readme_figures import serving as render
    print(render(report))
    print(f"wrote {out}; `python benchmarks/readme_figures.py` puts it in the README")


if __name__ == "__main__":
    main()
