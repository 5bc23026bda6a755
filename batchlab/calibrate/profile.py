"""Profile a backend's step time and fit the simulator's step-time model to it.

A burst of b identical requests (prompt p, o new tokens) arrives at once and runs down the path a
strategy uses: request-level (`run_batch`, e.g. HF `generate()`), or iteration-level (the
continuous scheduler, the driver and `step`, e.g. our step engine). Every token stamp ends a step,
so one burst gives its prefill step and o - 1 decode steps at contexts p+1 .. p+o-1. The grid is
batch sizes x contexts (decode) plus prompt lengths at batch 1 (prefill); each burst is repeated
after warm-up and each step's median kept. calibrate/fit.py turns the medians into a `StepCost`, saved
as JSON with the fit's error: `backend.kind: sim` + `backend.profile: FILE` then simulates it.
"""
from __future__ import annotations

import asyncio
import json
import os
from dataclasses import asdict, astuple, dataclass, replace
from pathlib import Path
from typing import Any

import click
import numpy as np

from batchlab.backends import TARGET, make_backend
from batchlab.backends.base import Engine
from batchlab.backends.cost import COEFFS, OPT_IN_TERMS, StepCost, attention_pairs, warm_weight
from batchlab.backends.presets import load_cost
from batchlab.calibrate.blackbox import WINDOW, ProbeGrid, most_samples
from batchlab.calibrate.fit import (
    SHAPE,
    Fit,
    StepSample,
    fit_step_times,
    fit_terms,
    opt_in_terms,
    samples_from,
    with_fit_terms,
)
from batchlab.core.clock import Clock, RealClock, VirtualClock
from batchlab.core.request import Request
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_user_config
from batchlab.run.driver import Inbox, drive
from batchlab.schedulers import SCHEDULERS, ContinuousConfig, ContinuousScheduler, scheduler_class


@dataclass(frozen=True)
class Grid:
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    contexts: tuple[int, ...] = (16, 64, 128, 256)   # decode: prompt lengths the decode steps start from
    prompts: tuple[int, ...] = (16, 64, 256, 512)    # prefill, at batch 1
    new_tokens: int = 12                             # tokens per burst: one prefill step, the rest decode
    repeats: int = 3                                 # medians over this many passes over the grid
    warmup: int = 1                                  # unmeasured passes over the grid first
    gap_s: float = 0.0                               # idle time before each burst (live traffic arrives after idle)
    terms: tuple[str, ...] = ()                      # fit: opt-in step-time terms it may use (cost.OPT_IN_TERMS)

    def shapes(self) -> list[tuple[int, int, int]]:
        """(rows, prompt tokens, new tokens) of every burst, decode grid first."""
        out = [(b, p, self.new_tokens) for b in self.batch_sizes for p in self.contexts]
        return out + [(1, p, 2) for p in self.prompts if (1, p, self.new_tokens) not in out]


@dataclass
class Profile:
    level: str                       # request | iteration
    samples: list[StepSample]
    fit: Fit
    cost: StepCost


def burst(rows: int, prompt: int, new: int, t0: float, tag: int) -> list[Request]:
    return [Request(f"profile{tag}-{i}", prompt, new, t0, index=tag * 1000 + i) for i in range(rows)]


async def time_burst(backend: Engine, level: str, reqs: list[Request], clock: Clock) -> np.ndarray:
    """Durations of the burst's steps, from the token stamps (step 0 is the prefill step)."""
    for r in reqs:
        backend.prepare(r)
    t0 = clock.now()
    if level == "request":
        await backend.run_batch(reqs, clock)
    else:
        tokens = sum(r.prompt_len for r in reqs)
        cfg = ContinuousConfig(max_num_seqs=len(reqs), max_num_batched_tokens=max(tokens, 1))
        # NOTE: decode windows as in a run of a trace, where the engine runs them
        windows = backend.facts().decode_windows
        await drive(ContinuousScheduler(cfg, 1 << 40, windows=windows, finish_in_window=windows), backend, clock, Inbox(reqs))
    stamps = reqs[0].token_times
    if len(stamps) != reqs[0].max_new_tokens or any(r.token_times != stamps for r in reqs):
        raise RuntimeError("profile burst: rows did not step together; cannot read step times")
    return np.diff(np.asarray([t0] + stamps))


def step_features(level: str, rows: int, prompt: int, k: int) -> dict[str, float]:
    """What step k of a burst contains, as the simulator charges it (StepSample's fields)."""
    if k == 0:
        return {"context_tokens": rows * prompt, "prefill_tokens": rows * prompt,
                "decode_rows": rows if level == "request" else 0,
                "attn_pairs": rows * attention_pairs(prompt, 0), "admitted": rows}
    return {"context_tokens": rows * (prompt + k), "prefill_tokens": 0, "decode_rows": rows,
            "warm": warm_weight(k) if level == "request" else 0.0}


async def measure(backend: Engine, level: str, grid: Grid, clock: Clock, progress=None) -> list[StepSample]:
    """Warm-up passes, then `repeats` passes over the grid; each step's median over the passes.
    NOTE: passes go round the whole grid rather than repeating one shape back to back, so a burst
    of noise from another process spreads over many shapes and the medians shrug it off."""
    await backend.start(clock)
    shapes = grid.shapes()
    runs: dict[tuple, list[np.ndarray]] = {s: [] for s in shapes}
    for rep in range(grid.warmup + grid.repeats):
        for n, shape in enumerate(shapes):
            await clock.sleep(grid.gap_s)
            d = await time_burst(backend, level, burst(*shape, clock.now(), rep * 1000 + n), clock)
            if rep >= grid.warmup:
                runs[shape].append(d)
    samples = []
    for (rows, prompt, new), ds in runs.items():
        med = np.median(np.stack(ds), axis=0)
        for k, seconds in enumerate(med):
            samples.append(StepSample(**step_features(level, rows, prompt, k), seconds=float(seconds),
                                      kind="prefill" if k == 0 else "decode"))
        if progress:
            tail = f", decode {1e3 * np.median(med[1:]):.2f} ms" if len(med) > 1 else ""
            progress(f"{rows} x {prompt} tokens: prefill {1e3 * med[0]:.1f} ms{tail}")
    return samples


def profile_backend(backend: Engine, strategy: str, grid: Grid = Grid(), progress=None) -> Profile:
    """Measure `backend` on the path `strategy` uses, fit, and return the calibrated StepCost."""
    level = scheduler_class(strategy).level
    clock: Clock = VirtualClock() if backend.virtual_time else RealClock()
    samples = clock.run(measure(backend, level, grid, clock, progress))
    fit = fit_step_times(samples, with_terms=grid.terms)
    mem = backend.facts().memory
    base = StepCost(0, 0, 0, 0, 0, kv_bytes_per_token=mem.kv_bytes_per_token if mem else 1,
                    kv_budget_bytes=mem.budget_bytes if mem else 1 << 50)
    described = backend.describe()
    name = f"{described.get('model', 'backend')}-{level}"
    cost = fit.to_cost(base)
    cost = type(cost)(**{**asdict(cost), "name": name,
                         "description": f"profile of {described.get('model', '?')} on {described.get('device', '?')} "
                                        f"({level}-level, fit rms error {100 * fit.rms_rel_error:.1f}%)"})
    return Profile(level, samples, fit, cost)


def save(profile: Profile, path: Path, setup: dict[str, Any], grid: Grid, vocab_size: int | None = None) -> None:
    """The profile JSON: the fitted StepCost, the fit's error, the grid, the setup, every sample, and
    the backend's vocabulary (so `batchlab serve` over the simulator checks token ids like the model)."""
    pred = profile.fit.predict(profile.samples)
    rows = [asdict(s) | {"fit_seconds": float(p)} for s, p in zip(profile.samples, pred)]
    path.parent.mkdir(parents=True, exist_ok=True)
    vocab = {"vocab_size": vocab_size} if vocab_size else {}
    profile.cost.to_json(path, level=profile.level, **profile.fit.summary(), grid=asdict(grid),
                         setup=setup, samples=rows, **vocab)


def refit(src: Path, dst: Path, without: tuple[str, ...] = (), with_terms: tuple[str, ...] | None = None) -> Fit:
    """Fit a saved profile's own samples again, with the terms in `without` held at zero, and save
    the result beside it: what each term earns is the held-out error with and without it.
    `with_terms`: the opt-in terms the fit may use (None: those the profile was fitted with)."""
    data = json.loads(src.read_text())
    if with_terms is not None:
        data = with_fit_terms(data, with_terms)
    try:
        samples = samples_from(older_samples(data["samples"], data.get("level", "iteration")))
        fit = fit_step_times(samples, without, fit_terms(data))
    except (KeyError, TypeError) as e:
        raise ConfigError(f"--refit {src}: not a measured profile (no step samples): {e}") from None
    except ValueError as e:
        raise ConfigError(f"--refit {src}: {e}") from None
    gone = f", without {', '.join(without)}" if without else ""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if "frontend_idle_s" in data:      # a server's profile: its front end is priced against its steps, so again
        from batchlab.calibrate.twin import refitted
        from batchlab.core.files import write_atomic
        record = refitted(data, samples, without, fit=fit)
        record["description"] = f"{data.get('description', record.get('name'))} refitted{gone}"
        write_atomic(dst, json.dumps(record | {"refit_from": str(src), "without": list(without)}, indent=2))
        return fit
    cost = fit.to_cost(StepCost.from_json(src))
    cost = replace(cost, description=f"{data.get('description', cost.name)} refitted{gone}")
    rows = [asdict(s) | {"fit_seconds": float(p)} for s, p in zip(samples, fit.predict(samples))]
    keep = {k: v for k, v in data.items() if k not in asdict(cost) and k not in fit.summary()}
    cost.to_json(dst, **(keep | fit.summary() | {"samples": rows, "refit_from": str(src), "without": list(without)}))
    return fit


def older_samples(rows: list[dict], level: str) -> list[dict]:
    """Samples saved before the attention, admission and warm-up features existed, with those
    features derived from the burst structure `measure` writes: each burst is its prefill step
    (k = 0) followed by its decode steps in order, so rows, prompt and k can be read back."""
    if not rows or "admitted" in rows[0]:
        return rows
    out, rows_in_burst, prompt, k = [], 0, 0, 0
    for i, row in enumerate(rows):
        if row["kind"] == "prefill":
            nxt = rows[i + 1] if i + 1 < len(rows) and rows[i + 1]["kind"] == "decode" else None
            rows_in_burst = int(row["decode_rows"] or (nxt["decode_rows"] if nxt else 1))
            prompt, k = int(round(row["prefill_tokens"] / rows_in_burst)), 0
        else:
            k += 1
        out.append(row | step_features(level, rows_in_burst, prompt, k) | {"seconds": row["seconds"]})
    return out


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected comma-separated positive integers, e.g. 1,2,4,8") from None
    if not vals or min(vals) < 1:
        raise ConfigError(f"{flag} {text!r}: expected comma-separated positive integers, e.g. 1,2,4,8")
    return vals


@click.command("profile")
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key (repeatable).")
@click.option("--preset", default=None, help="Write a simulator preset as a profile (no measuring).")
@click.option("--strategy", type=click.Choice(list(SCHEDULERS)), default="continuous", show_default=True,
              help="Which path to profile: naive/dynamic = request-level batches, continuous = steps.")
@click.option("--batch-sizes", default="1,2,4,8,16,32", show_default=True)
@click.option("--contexts", default="16,64,128,256", show_default=True, help="Decode: prompt lengths to decode from.")
@click.option("--prompts", default="16,64,256,512", show_default=True, help="Prefill: prompt lengths at batch 1.")
@click.option("--streams", default="1,4,16", show_default=True,
              help="A server (backend.kind openai): decoding streams each prefill probe's prompt is sent beside.")
@click.option("--crowds", default="", show_default=True,
              help="A server: prompts sent at once beside one stream, comma-separated (e.g. 4,8,16): steps admitting "
                   "many requests tell a price per admitted request from a prompt pass's setup (none by default).")
@click.option("--arrival-rounds", type=int, default=3, show_default=True,
              help="A server: rounds of the arrival probe that prices its front end's engine time (0: none).")
@click.option("--hand-over-rounds", type=int, default=3, show_default=True,
              help="A server: bursts of 32 prompts sent at once whose engine steps its /metrics counts (0: none).")
@click.option("--hand-over-fit", is_flag=True,
              help="A server: the twin's front end takes the engine time that splits those bursts as the server did.")
@click.option("--new-tokens", type=int, default=12, show_default=True, help="Tokens per burst.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Measured passes (medians).")
@click.option("--warmup", type=int, default=1, show_default=True, help="Unmeasured passes over the grid.")
@click.option("--gap-ms", type=float, default=0.0, show_default=True,
              help="Idle time before each burst: requests of live traffic often arrive at an idle backend.")
@click.option("--refit", "refit_src", default=None, type=click.Path(dir_okay=False),
              help="Fit this profile's saved samples again (no measuring), e.g. with --without.")
@click.option("--without", default="", help=f"With --refit: step-time terms held at zero, comma-separated ({', '.join((*COEFFS[1:], SHAPE))}).")
@click.option("--with", "with_terms", default=None, metavar="TERMS",
              help=f"Opt-in step-time terms the fit may use, comma-separated ({', '.join(OPT_IN_TERMS)}: a server whose "
                   "attention takes every query of a step against every key the step reads, as transformers serve's "
                   "does); with --refit, in place of the profile's own (none: no such term).")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="Profile JSON to write.")
@click.option("--twin", "twin", default=None, type=click.Path(dir_okay=False),
              help="A server (backend.kind openai): where its twin's run config goes (default: beside --out, NAME.twin.yaml).")
def profile_cmd(config, overrides, preset, strategy, batch_sizes, contexts, prompts, streams, crowds, arrival_rounds,
                hand_over_rounds, hand_over_fit, new_tokens, repeats, warmup, gap_ms, refit_src, without, with_terms, out,
                twin):
    """Measure a backend's step times, fit the simulator's model, save it as a profile JSON. A
    server (backend.kind openai) is profiled from the client, and its twin's config written too."""
    user_errors(_profile_main)(config, overrides, preset, strategy, batch_sizes, contexts, prompts,
                               new_tokens, repeats, warmup, gap_ms, refit_src, without, out, twin, streams, arrival_rounds,
                               crowds, hand_over_rounds, hand_over_fit, with_terms)


def _profile_server(cfg, grid: Grid, path: Path, twin: str | None, streams: str, arrival_rounds: int, crowds: str,
                    hand_over_rounds: int = 3, hand_over_fit: bool = False) -> None:
    """A server (backend.kind openai) measured from the client, once its grid is known to give enough samples."""
    from batchlab.calibrate.front_end import ArrivalProbe
    from batchlab.calibrate.handover import HandOverProbe
    from batchlab.calibrate.server import profile_server
    probes = ProbeGrid(*astuple(grid)[:6], gap_s=grid.gap_s or ProbeGrid.gap_s, streams=_ints(streams, "--streams"),
                       crowds=_ints(crowds, "--crowds") if crowds else (), terms=grid.terms)
    if most_samples(probes) < len(COEFFS):
        raise ConfigError(f"the grid gives at most {most_samples(probes)} step samples from a server's streams; the "
                          f"step-time model has {len(COEFFS)} terms to fit: add batch sizes, contexts or prompts, "
                          f"or raise --new-tokens (a decode sample takes {WINDOW} tokens)")
    if arrival_rounds < 0:
        raise ConfigError(f"--arrival-rounds must be >= 0 (got {arrival_rounds})")
    if hand_over_rounds < 0 or (hand_over_fit and not hand_over_rounds):
        raise ConfigError(f"--hand-over-rounds must be >= 0, and >= 1 with --hand-over-fit (got {hand_over_rounds})")
    twin_path = Path(twin) if twin else path.with_name(path.stem + ".twin.yaml")
    profile_server(cfg, probes, path, twin_path, progress=lambda m: click.echo(f"  {m}"),
                   arrivals=ArrivalProbe(rounds=arrival_rounds) if arrival_rounds else None,
                   hand_over=HandOverProbe(rounds=hand_over_rounds, fit=hand_over_fit) if hand_over_rounds else None)


def _profile_main(config, overrides, preset, strategy, batch_sizes, contexts, prompts, new_tokens, repeats, warmup,
                  gap_ms, refit_src, without, out, twin=None, streams="1,4,16", arrival_rounds=3, crowds="",
                  hand_over_rounds=3, hand_over_fit=False, with_terms=None):
    path = Path(out)
    if without and refit_src is None:
        raise ConfigError("--without goes with --refit (a measured profile fits every term)")
    terms = None if with_terms is None else opt_in_terms(with_terms)
    if refit_src is not None:
        return _refit_main(refit_src, without, path, bool(config or overrides or preset), terms)
    if preset is not None:
        if config or overrides:
            raise ConfigError("--preset writes a preset as it is; do not give a config or --set with it")
        load_cost(preset).to_json(path, level="any", source="preset")
        click.echo(f"wrote preset {preset!r} as a profile: {path}")
        return
    if new_tokens < 2 or repeats < 1 or warmup < 0 or gap_ms < 0:
        raise ConfigError("--new-tokens must be >= 2, --repeats >= 1, --warmup >= 0, --gap-ms >= 0")
    grid = Grid(_ints(batch_sizes, "--batch-sizes"), _ints(contexts, "--contexts"), _ints(prompts, "--prompts"),
                new_tokens, repeats, warmup, gap_ms / 1e3, terms or ())
    steps = sum(n for _, _, n in grid.shapes())
    if steps < len(COEFFS):          # NOTE: checked before measuring, not after minutes of it
        raise ConfigError(f"the grid gives {steps} steps; the step-time model has {len(COEFFS)} terms to fit: "
                          "add batch sizes, contexts or prompts, or raise --new-tokens")
    cfg = load_user_config(config, overrides)
    if (crowds or hand_over_fit) and cfg.backend.role != TARGET:
        raise ConfigError(f"{'--crowds' if crowds else '--hand-over-fit'} probes a server (backend.kind openai); this "
                          "backend's steps are timed directly")
    if cfg.backend.role == TARGET:
        return _profile_server(cfg, grid, path, twin, streams, arrival_rounds, crowds, hand_over_rounds, hand_over_fit)
    cfg = cfg.model_copy(update={"strategies": [strategy]})
    backend = make_backend(cfg)
    load_before = os.getloadavg()[0]
    try:
        prof = profile_backend(backend, strategy, grid, progress=lambda m: click.echo(f"  {m}"))
        # NOTE: other processes' load is the main error source on a shared machine: keep it with the data.
        setup = backend.describe() | {"load_avg_1min": [load_before, os.getloadavg()[0]], "cpu_count": os.cpu_count()}
        vocab = backend.facts().vocab_size
    finally:
        asyncio.run(backend.close())
    save(prof, path, setup, grid, vocab)
    c, f = prof.cost, prof.fit
    click.echo(f"fit ({prof.level}-level, {f.num_samples} steps): overhead {1e3 * c.overhead_s:.3f} ms/step, "
               f"kv {1e6 * c.kv_s_per_token:.3f} us/context token, prefill {1e6 * c.prefill_s_per_token:.2f} us/token, "
               f"decode {1e3 * c.decode_s_per_row:.3f} ms/row, prefill pass {1e3 * c.prefill_step_s:.3f} ms, "
               f"attention {1e9 * c.attn_s_per_pair:.3f} ns/pair, admission {1e3 * c.admit_s:.3f} ms/request, "
               f"warm-up {1e3 * c.warmup_s:.3f} ms, prompt beside rows {1e9 * c.mix_s_per_token_row:.3f} ns/token-row, "
               f"dense attention {1e9 * c.dense_s_per_pair:.4f} ns/pair; "
               f"error rms {100 * f.rms_rel_error:.1f}%, "
               f"max {100 * f.max_rel_error:.1f}%")
    click.echo(f"wrote {path}")


def _refit_main(refit_src: str, without: str, path: Path, with_config: bool, with_terms: tuple[str, ...] | None = None) -> None:
    """profile --refit: fit a saved profile's samples again, some terms held at zero."""
    if with_config:
        raise ConfigError("--refit fits a saved profile's samples; do not give a config, --set or --preset with it")
    src = Path(refit_src)
    if not src.is_file():
        raise ConfigError(f"--refit: file not found: {src}")
    terms = tuple(t.strip() for t in without.split(",") if t.strip())
    bad = [t for t in terms if t not in (*COEFFS[1:], SHAPE)]
    if bad:
        raise ConfigError(f"--without {', '.join(bad)}: unknown term; terms: {', '.join((*COEFFS[1:], SHAPE))}")
    f = refit(src, path, terms, with_terms)
    extra = f", with {', '.join(with_terms)}" if with_terms else ""
    click.echo(f"refitted {src} ({f.num_samples} steps{', without ' + ', '.join(terms) if terms else ''}{extra}): "
               f"error rms {100 * f.rms_rel_error:.1f}%, max {100 * f.max_rel_error:.1f}%")
    click.echo(f"wrote {path}")
