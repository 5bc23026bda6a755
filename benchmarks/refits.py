"""One server's profile fitted other ways, each judged on what the server did.

    python benchmarks/refits.py DIR [--rows 32] [--admitted 2] [--without admit_s] [--with none] [--front-end-idle] [--beyond-rows]
                                [--priced-front-end] [--hand-over-from MS,...] [--whatif RECORD ...] [--base-cap 32]
                                [--sizes RECORD ...]
                                [--json docs/results/refits_NAME.json]

DIR holds a black-box profile and its twin (profile.json, twin.yaml: `batchlab profile` or
benchmarks/twin.py writes them). Besides the profile as it was fitted, each variant fits the
step-time model again on the profile's own measured steps, with the front end priced again from
the profile's own arrival readings against the new steps (calibrate/twin.py `refitted`), and
writes its profile and twin beside the originals (profile-VARIANT.json, twin-VARIANT.yaml), so a
kept validation can be judged on it too (benchmarks/corrections.py NAME=DIR@TWIN):
  --rows N: only the steps of at most N decode rows, what a profile of the server at a sequence
     cap of N can batch; on a profile taken at a larger cap (benchmarks/twin.py --batch-sizes up
     to it), the steps beyond N show how far the fit carries past the batches it saw;
  --admitted N: only the steps admitting at most N requests, what a profile without crowds of
     prompts sees (its prefill probes admit one or two); on a profile with crowds (batchlab
     profile --crowds), what the steps admitting many add to the fit;
  --without TERMS: every step, the named terms held at zero (calibrate/fit.py COEFFS);
  --with TERMS: every step, fitted with these opt-in terms (backends/cost.py OPT_IN_TERMS; `none`:
     none of them) in place of those the profile was fitted with;
  --front-end-idle: the steps as fitted, the front end as the profile's idle reading, on the
     engine: requests handed over one at a time, each taking the engine's time for it
     (calibrate/twin.py `idle_reading`), where the arrival probe's price may hand them over at once;
  --beyond-rows: the steps as fitted, and every decode row past the profile's largest batch priced
     at what its top two batch sizes grew beyond the fitted lines (calibrate/twin.py
     `beyond_the_profile`), where the lines alone are carried on;
  --priced-front-end: the steps as fitted, the front end's engine time as priced before the
     hand-over probe moved it (calibrate/twin.py `as_priced`): the twin without the hand-over;
  --hand-over-from MS,...: for each start (milliseconds of engine time per request, or `idle`: the
     profile's idle reading), two variants: the front end taking that much of the engine, and the
     hand-over fitted from there (calibrate/twin.py `engine_time_at`, `handed_over_from`): what the
     hand-over probe's reading alone sets, whatever the arrival probe priced.
Per decode batch size, and per count of requests a prompt step admitted: the measured steps'
median and each variant's median relative error on them. Per --whatif (a benchmarks/twin.py record of bursts measured at several sequence caps): each
cap's burst on the server (median of its runs) and on every variant's twin, and each cap's change
from --base-cap (default: the record's first cap, the profile's own server) on both sides; the
server's read pair by pair where a cap ran beside its own control (benchmarks/twin.py --whatif-pairs).
Per --sizes (a benchmarks/twin.py record of bursts of several sizes sent at once, --parts sizes):
each size's burst on the server (median of its runs: output tok/s over the whole burst, the median
gap between two tokens) and on every variant's twin.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import yaml

from batchlab.backends.cost import COEFFS, StepCost
from batchlab.calibrate.fit import SHAPE, StepSample, opt_in_terms, samples_from, with_fit_terms
from batchlab.calibrate.twin import (
    as_priced,
    beyond_the_profile,
    engine_time_at,
    handed_over_from,
    idle_reading,
    refitted,
    rows_past,
)
from batchlab.calibrate.twin_check import Twin, measured_change, predicted_burst, predicted_whole_burst, steps_over
from batchlab.core.files import write_atomic
from batchlab.errors import ConfigError, user_errors
from batchlab.run.config import load_config

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("tok_s", "tpot_p50", "ttft_p50")
GAP = "gap_p50"             # a burst's median gap between two tokens: in records since it was measured
AS_FITTED = "as profiled"
IDLE = "front end one at a time"
BEYOND = "rows past the profile"
PRICED = "front end as priced"


def variants(d: Path, prof: dict, rows: int | None, without: tuple[str, ...], admitted: int | None = None,
             idle: bool = False, beyond: bool = False, priced: bool = False,
             starts: tuple[str, ...] = (), with_terms: tuple[str, ...] | None = None,
             past: bool = False) -> dict[str, Path]:
    """Each variant's twin config, written beside the profile's own: name -> twin.yaml path
    (`past`, with `rows`: the fit on at most `rows` rows with the rows past them priced as well)."""
    samples, out = samples_from(prof["samples"]), {AS_FITTED: d / "twin.yaml"}
    twin_cfg = load_config(d / "twin.yaml")
    asked = refits_asked(prof, samples, rows, admitted, without, with_terms)
    carried = beyond_the_profile(prof) if beyond else None      # NOTE: every refusal before anything is written
    before = as_priced(prof) if priced else None
    handed = {}
    for start in starts:
        engine_s = prof["frontend_idle_s"] if start == "idle" else float(start) / 1e3
        said = f"{1e3 * engine_s:.2f} ms" + (" (idle)" if start == "idle" else "")
        handed[start] = (said, engine_time_at(prof, engine_s), handed_over_from(prof, engine_s, twin_cfg))
    fitted = {name: refitted(record, mine, terms, twin_cfg) for name, _, mine, terms, record in asked}
    # the fit on at most `rows` rows, its rows past them priced from the bigger steps
    small_past = rows_past(fitted[f"fit on ≤ {rows} rows"], samples, rows) if rows and past else None
    if idle:
        out[IDLE] = beside(d, "front-end-idle", idle_reading(prof), IDLE)
    if carried:
        out[BEYOND] = beside(d, "beyond-rows", carried, "decode rows past the profile's largest batch priced at its "
                             "top two batches' growth beyond the lines")
    if before:
        out[PRICED] = beside(d, "front-end-priced", before, "the front end's engine time as priced before the hand-over")
    for start, (said, at, handed_fit) in handed.items():
        out[f"front end {said}"] = beside(d, f"front-end-at-{start}", at, f"the front end taking {said} of the engine")
        out[f"hand-over from {said}"] = beside(d, f"hand-over-from-{start}", handed_fit,
                                               f"the hand-over fitted from {said} of the engine")
    for name, tag, *_ in asked:
        out[name] = beside(d, tag, fitted[name], f"the profile fitted again: {name}")
    if small_past:
        out[f"fit on ≤ {rows} rows, rows past priced"] = beside(
            d, f"rows-le-{rows}-past", small_past,
            f"the profile fitted again on at most {rows} rows, the rows past them priced from its bigger steps")
    return out


def refits_asked(prof: dict, samples: list[StepSample], rows: int | None, admitted: int | None,
                 without: tuple[str, ...], with_terms: tuple[str, ...] | None) -> list[tuple]:
    """(name, file tag, samples, terms held at zero, record) of each refit asked for, or one line
    where the profile has nothing for it to leave out."""
    asked = []
    if rows:
        mine = [s for s in samples if s.decode_rows <= rows]
        if len(mine) == len(samples):
            raise ConfigError(f"the profile has no step of more than {rows} rows: profile a server started at a "
                              "larger cap with batch sizes up to it (benchmarks/twin.py --batch-sizes)")
        asked.append((f"fit on ≤ {rows} rows", f"rows-le-{rows}", mine, (), prof))
    if admitted is not None:
        mine = [s for s in samples if s.admitted <= admitted]
        if len(mine) == len(samples):
            raise ConfigError(f"the profile has no step admitting more than {admitted} requests: profile the server "
                              "with crowds of prompts (batchlab profile --crowds, benchmarks/twin.py --crowds)")
        asked.append((f"fit on ≤ {admitted} admissions", f"admitted-le-{admitted}", mine, (), prof))
    if without:
        asked.append((f"without {', '.join(without)}", "without-" + "-".join(without), samples, without, prof))
    if with_terms is not None:
        said = ", ".join(with_terms) or "no opt-in term"
        asked.append((f"with {said}", "with-" + ("-".join(with_terms) or "none"), samples, (),
                      with_fit_terms(prof, with_terms)))
    return asked


def beside(d: Path, tag: str, profile: dict, what: str) -> Path:
    """A variant's profile and twin written beside the originals (profile-TAG.json, twin-TAG.yaml)."""
    path = d / f"profile-{tag}.json"
    write_atomic(path, json.dumps(profile, indent=2) + "\n")
    tree = yaml.safe_load((d / "twin.yaml").read_text())
    tree["backend"]["profile"] = str(path.resolve())
    write_atomic(d / f"twin-{tag}.yaml", f"# twin.yaml with {what}.\n" + yaml.safe_dump(tree, sort_keys=False))
    return d / f"twin-{tag}.yaml"


def judged(mine: list[StepSample], costs: dict[str, StepCost]) -> dict:
    """Some measured steps' median, and each variant's median prediction and median relative error
    over the same steps."""
    measured = np.array([s.seconds for s in mine])
    out = {"steps": len(mine), "measured_s": float(np.median(measured)), "variants": {}}
    for name, c in costs.items():
        pred = np.array([c.step_time(s.context_tokens, s.prefill_tokens, s.decode_rows, s.attn_pairs, s.admitted)
                         for s in mine])
        out["variants"][name] = {"predicted_s": float(np.median(pred)), "error": float(np.median(pred / measured - 1))}
    return out


def by_batch(samples: list[StepSample], costs: dict[str, StepCost]) -> list[dict]:
    """Per decode batch size: its measured steps, judged."""
    decode = [s for s in samples if s.kind == "decode"]
    return [{"rows": int(b)} | judged([s for s in decode if s.decode_rows == b], costs)
            for b in sorted({s.decode_rows for s in decode})]


def by_admitted(samples: list[StepSample], costs: dict[str, StepCost]) -> list[dict]:
    """Per count of requests admitted in a step (the prompt probes' steps): those steps, judged,
    and their prompt tokens."""
    return [{"admitted": int(k), "prompt_tokens": sorted({int(s.prefill_tokens) for s in samples if s.admitted == k})}
            | judged([s for s in samples if s.admitted == k], costs)
            for k in sorted({s.admitted for s in samples if s.admitted})]


def whatif(path: Path, twins: dict[str, Twin], base: int | None) -> dict:
    """Every cap of a what-if record: the server's median burst figures and each twin's, and the
    change from cap `base` on each side."""
    w = json.loads(path.read_text())["conditions"]["quiet"]["whatif"]
    n, p, o = (w["burst"][k] for k in ("requests", "prompt", "output"))
    base = w["caps"][0]["cap"] if base is None else base
    runs = [r for c in w["caps"] for r in c["measured"]]
    keys = (*KEYS, GAP) if all(GAP in r for r in runs) else KEYS
    caps = []
    for c in w["caps"]:
        real = {k: statistics.median(r[k] for r in c["measured"]) for k in keys} | counted(c["measured"], c["cap"])
        bursts = {name: predicted_burst(t, n, p, o, max_num_seqs=c["cap"]) for name, t in twins.items()}
        caps.append({"cap": c["cap"], "measured": real, "variants": {
            name: {k: b[k] for k in keys} | {"steps": b["steps"], "prompt_steps": steps_over(b["step_sizes"], c["cap"])}
            for name, b in bursts.items()}})
    ref = next(c for c in caps if c["cap"] == base)
    for c, kept in zip(caps, w["caps"], strict=True):
        # from the record's first cap, a cap run beside its control reads its change pair by pair
        real = ({k: measured_change(kept, w["caps"][0], k)[0] for k in keys} if base == w["caps"][0]["cap"] else
                {k: c["measured"][k] / ref["measured"][k] - 1 for k in keys})
        c["change"] = {"measured": real} | {
            name: {k: v[k] / ref["variants"][name][k] - 1 for k in keys} for name, v in c["variants"].items()}
    return {"record": os.path.relpath(path.resolve(), ROOT), "burst": w["burst"], "base_cap": base, "caps": caps}


SPAN = ("span_tok_s", GAP)      # what a burst run at once is judged by (calibrate/twin_check.py whole_burst)


def sizes(path: Path, twins: dict[str, Twin]) -> dict:
    """Every size of a sizes record: the server's median figures over its runs and each twin's."""
    s = sizes_record(path)
    p, o = s["burst"]["prompt"], s["burst"]["output"]
    rows = []
    for row in s["sizes"]:
        real = {k: statistics.median(r[k] for r in row["measured"]) for k in SPAN}
        bursts = {name: predicted_whole_burst(t, row["requests"], p, o) for name, t in twins.items()}
        rows.append({"requests": row["requests"], "measured": real,
                     "variants": {name: {k: b[k] for k in SPAN} for name, b in bursts.items()}})
    return {"record": os.path.relpath(path.resolve(), ROOT), "burst": s["burst"], "sizes": rows}


def counted(runs: list[dict], cap: int) -> dict:
    """The median engine steps of a cap's bursts on the server, and of its prompt steps, where its
    /metrics counted every burst's."""
    if not all("step_sizes" in r for r in runs):
        return {}
    return {"steps": statistics.median(r["steps"] for r in runs),
            "prompt_steps": statistics.median(steps_over(r["step_sizes"], cap) for r in runs)}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path, help="a profile's directory: profile.json and twin.yaml")
    ap.add_argument("--rows", type=int, help="a variant fitted on the steps of at most this many decode rows")
    ap.add_argument("--admitted", type=int,
                    help="a variant fitted on the steps admitting at most this many requests (a profile without crowds)")
    ap.add_argument("--without", default="", help="a variant fitted with these terms held at zero (comma-separated)")
    ap.add_argument("--with", dest="with_terms", default=None, metavar="TERMS",
                    help="a variant fitted with these opt-in terms in place of the profile's own (comma-separated; none: no such term)")
    ap.add_argument("--front-end-idle", action="store_true",
                    help="a variant with the front end as the profile's idle reading, handing requests over one at a time")
    ap.add_argument("--beyond-rows", action="store_true",
                    help="a variant pricing decode rows past the profile's largest batch at its top batches' growth")
    ap.add_argument("--past-rows", action="store_true",
                    help="with --rows N: a variant fitted on at most N rows, its rows past N priced from the bigger steps")
    ap.add_argument("--priced-front-end", action="store_true",
                    help="a variant with the front end's engine time as priced before the hand-over probe moved it")
    ap.add_argument("--hand-over-from", default="",
                    help="variants from these front-end engine times (ms, or idle), and the hand-over fitted from each")
    ap.add_argument("--whatif", type=Path, action="append", default=[],
                    help="a benchmarks/twin.py record of bursts at several caps (repeatable)")
    ap.add_argument("--sizes", type=Path, action="append", default=[],
                    help="a benchmarks/twin.py record with bursts of several sizes (--parts sizes) to judge each twin on")
    ap.add_argument("--base-cap", type=int, help="the cap each what-if's changes are taken from (default: its first)")
    ap.add_argument("--json", type=Path, default=ROOT / "docs" / "results" / "refits.json")
    return checked(ap.parse_args(argv))


def checked(a: argparse.Namespace) -> argparse.Namespace:
    """The arguments, each checked before any variant is written, --without, --with and
    --hand-over-from as tuples."""
    a.without = tuple(t for t in a.without.split(",") if t)
    if bad := [t for t in a.without if t not in (*COEFFS[1:], SHAPE)]:
        raise ConfigError(f"--without: unknown term {', '.join(bad)} (terms: {', '.join((*COEFFS[1:], SHAPE))})")
    a.with_terms = None if a.with_terms is None else opt_in_terms(a.with_terms)
    if a.past_rows and not a.rows:
        raise ConfigError("--past-rows goes with --rows N: the rows past N are priced from the profile's bigger steps")
    if not (a.dir / "profile.json").is_file() or not (a.dir / "twin.yaml").is_file():
        raise ConfigError(f"{a.dir}: want a profile's directory with profile.json and twin.yaml")
    if missing := [str(p) for p in a.whatif if not p.is_file()]:
        raise ConfigError(f"--whatif {', '.join(missing)}: no such file")
    for path in a.sizes:
        sizes_record(path)
    a.hand_over_from = starts(a.hand_over_from)
    if not (a.rows or a.without or a.admitted is not None or a.front_end_idle or a.beyond_rows or a.priced_front_end
            or a.hand_over_from or a.with_terms is not None):
        raise ConfigError("name a variant: --rows N, --admitted N, --without TERMS, --with TERMS, --front-end-idle, --beyond-rows, "
                          "--priced-front-end, --hand-over-from MS, or several")
    read_idle = "frontend_idle_s" in json.loads((a.dir / "profile.json").read_text())
    for flag, asked in (("--front-end-idle", a.front_end_idle), ("--hand-over-from", a.hand_over_from)):
        if asked and not read_idle:
            raise ConfigError(f"{flag}: {a.dir / 'profile.json'} has no idle front-end reading (frontend_idle_s); "
                              "a profile of a server records one")
    if a.admitted is not None and a.admitted < 0:
        raise ConfigError(f"--admitted: want 0 or more, got {a.admitted}")
    for path in a.whatif:          # NOTE: before any variant is written beside the profile
        try:
            caps = [c["cap"] for c in json.loads(path.read_text())["conditions"]["quiet"]["whatif"]["caps"]]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ConfigError(f"--whatif {path}: not a benchmarks/twin.py record with a what-if") from None
        if a.base_cap is not None and a.base_cap not in caps:
            raise ConfigError(f"--base-cap {a.base_cap}: {path} has caps {', '.join(map(str, caps))}")
    return a


def sizes_record(path: Path) -> dict:
    """A benchmarks/twin.py record's bursts of several sizes, or one line saying it has none."""
    try:
        return json.loads(path.read_text())["conditions"]["quiet"]["sizes"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        raise ConfigError(f"--sizes {path}: not a benchmarks/twin.py record with bursts of several sizes "
                          "(--parts sizes)") from None


def starts(text: str) -> tuple[str, ...]:
    """--hand-over-from's values: milliseconds (0 or more) or `idle`, comma-separated."""
    out = tuple(t.strip() for t in text.split(",") if t.strip())
    for t in out:
        try:
            if t != "idle" and float(t) < 0:
                raise ValueError
        except ValueError:
            raise ConfigError(f"--hand-over-from: want milliseconds (0 or more) or idle, got {t!r}") from None
    return out


@user_errors
def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    prof = json.loads((a.dir / "profile.json").read_text())
    samples = samples_from(prof["samples"])
    twins = {name: Twin(load_config(path)) for name, path in variants(a.dir, prof, a.rows, a.without, a.admitted,
                                                                              a.front_end_idle, a.beyond_rows,
                                                                              a.priced_front_end,
                                                                              a.hand_over_from, a.with_terms,
                                                                              a.past_rows).items()}
    costs = {name: t.cfg.backend.cost() for name, t in twins.items()}
    out = {"command": " ".join(["python benchmarks/refits.py", *(argv if argv is not None else sys.argv[1:])]),
           "profile": os.path.relpath((a.dir / "profile.json").resolve(), ROOT), "grid": prof["grid"],
           "fits": {name: {"fit_rms_rel_error": json.loads(Path(t.cfg.backend.profile).read_text()).get("fit_rms_rel_error")}
                    | {k: getattr(costs[name], k) for k in (*COEFFS, "admit_s_per_row", "frontend_s", "first_token_s",
                                                            "rows_profiled", "beyond_s_per_row")}
                    for name, t in twins.items()},
           "batches": by_batch(samples, costs),
           "admissions": by_admitted(samples, costs),
           "whatif": [whatif(p, twins, a.base_cap) for p in a.whatif],
           "sizes": [sizes(p, twins) for p in a.sizes]}
    write_atomic(a.json, json.dumps(out, indent=2) + "\n")
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
