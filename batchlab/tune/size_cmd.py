"""`batchlab size CONFIG`: search GPUs x TP x cap x replicas (tune/size.py), print the ranked table,
the pick, what the next cheaper settings miss, and write size.json, size.csv and size.png.
Everything the search reads is checked, and the output directory too, before any simulation."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import click

from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_user_config
from batchlab.run.executors import make_executor
from batchlab.run.results import check_location
from batchlab.schedulers import scheduler_class
from batchlab.tune.size import SizeResult, devices, size
from batchlab.tune.size_report import catalog_lines, report_lines, to_json
from batchlab.tune.target import strategy_and_slos


def _ints(text: str, what: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ConfigError(f"{what} {text!r}: expected whole numbers separated by commas, e.g. 1,2,4,8") from None
    if not values or values[0] < 1 or values[-1] > 8:
        raise ConfigError(f"{what} {text!r}: every value must be from 1 to 8 (the GPUs of one node)")
    return values


@click.command("size")
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key (repeatable).")
@click.option("--slo", "slos", multiple=True, metavar="METRIC=LIMIT",
              help="A percentile SLO instead of the config's slo section, e.g. tpot_p95=60ms (repeatable).")
@click.option("--gpus", default=None, help="GPUs to consider, comma-separated (default: the whole catalog).")
@click.option("--tp", "tps", default="1,2,4,8", show_default=True, help="Tensor-parallel degrees to consider.")
@click.option("--strategy", default=None, help="The strategy to size (default: continuous if listed, else the first).")
@click.option("--max-replicas", type=int, default=64, show_default=True, help="Most replicas one setting may use.")
@click.option("--max-cap", type=int, default=1024, show_default=True, help="Largest sequence cap to consider.")
@click.option("--out", default="results/size", show_default=True, help="Directory for size.json, size.csv and size.png.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default=None,
              help="Where the simulated settings run (the config's executor.kind).")
@click.option("--exhaustive", is_flag=True,
              help="Find every (device, cap)'s fewest replicas, not only those that could be the cheapest.")
@click.option("--list-gpus", is_flag=True, help="Print the GPU catalog and exit.")
@user_errors
def size_cmd(config, overrides, slos, gpus, tps, strategy, max_replicas, max_cap, out, executor, exhaustive,
             list_gpus) -> None:
    """The cheapest GPU type, tensor-parallel degree, replica count and sequence cap that hold the
    SLO at the config's traffic (synthetic or a replayed trace), checked in simulation."""
    if list_gpus:
        for line in catalog_lines():
            click.echo(line)
        return
    cfg = load_user_config(config, list(overrides) + ([f"executor.kind={executor}"] if executor else []))
    if cfg.backend.kind != "sim":
        raise ConfigError(f"size: sizes in simulation: backend.kind sim (a model shape with backend.shape, a preset, "
                          f"a profile or backend.linear), not '{cfg.backend.kind}'")
    if cfg.traffic.sessions is not None:
        raise ConfigError("size: traffic.sessions cannot be sized yet: a turn arrives when the last answer ends, so the "
                          "offered work depends on the setting; replay a run's requests.csv as a trace instead")
    strategy, limits = strategy_and_slos(cfg, "size", slos, strategy, "tpot_p95=60ms")
    if max_replicas < 1 or max_cap < 1:
        raise ConfigError("size: --max-replicas and --max-cap must be at least 1")
    if cfg.backend.shape is None and (gpus or tps != "1,2,4,8"):
        raise ConfigError("size: --gpus and --tp choose hardware for a model shape: set backend.shape "
                          "(e.g. random:llama3-8b) and backend.gpu")
    devs = devices(cfg, [g for g in gpus.split(",") if g.strip()] if gpus else None, _ints(tps, "--tp"))
    out_dir = Path(out)
    check_location(out_dir)
    runner = make_executor(cfg.executor)
    try:
        res = size(cfg, strategy, scheduler_class(strategy).cap, limits, devs, max_replicas, max_cap, runner, exhaustive,
                   progress=lambda line: click.echo(line, err=True))
    finally:
        runner.close()
    write_outputs(res, out_dir)
    for line in report_lines(res):
        click.echo(line)
    click.echo(f"wrote {out_dir / 'size.json'}, {out_dir / 'size.csv'}, {out_dir / 'size.png'}")


def write_outputs(res: SizeResult, out_dir: Path) -> None:
    from batchlab.tune.size_plot import plot
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "size.json", json.dumps(to_json(res), indent=2, default=str))
    rows = [s.record() | {"why": "; ".join(s.why)} for s in res.ranked]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns)
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(out_dir / "size.csv", buf.getvalue())
    plot(res, out_dir / "size.png")
