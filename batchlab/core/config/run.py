"""The sections every run has, whatever its backend and strategies: the run's name and output,
its strategies, traffic and SLO, where points run, and `batchlab validate`'s workloads.

`RunConfig` here is the base of the model a run is validated with: run/config.py adds the
`backend` section (a union of the registered kinds, discriminated on `kind`) and one section per
registered scheduler's options, so nothing here names a backend or a strategy.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from batchlab.core.config.base import GROWS, IGNORED, NO_EFFECT, Model, format_error, identity_role
from batchlab.core.config.traffic import SLOConfig, TrafficConfig

# A strategy is a registered name, or a policy of your own by import path (`pkg.module:Class`).
STRATEGY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*(:[A-Za-z_][A-Za-z0-9_]*)?$"
Strategy = Annotated[str, Field(min_length=1, max_length=200, pattern=STRATEGY_PATTERN)]


class ExecutorConfig(Model):
    """Where a sweep's points run (run/executors.py). `local`: one after another in this process.
    `ray`: each point is a Ray task; the process that started the sweep writes every result.
    NOTE: where points run never changes what they mean, so this section is left out of
    experiment identities, point hashes and config.yaml; setup.json records the placement."""
    kind: Literal["local", "ray"] = "local"
    """local, or ray (each point a Ray task)."""
    address: str | None = None
    """ray: a cluster's address, or auto (unset: $RAY_ADDRESS, else a Ray started here)."""
    num_cpus: Annotated[int, Field(gt=0, le=1 << 16)] | None = None
    """ray, started here: CPUs it may use (unset: all)."""
    max_retries: Annotated[int, Field(ge=0, le=100)] = 2
    """ray: reruns of a point whose worker died."""

    @field_validator("address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"auto|local|(ray://)?[A-Za-z0-9_.\-\[\]:]+(:\d{1,5})?", v):
            raise ValueError("expected auto, HOST:PORT or ray://HOST:PORT")
        return v


class ValidateConfig(Model):
    """`batchlab validate`'s held-out workloads (calibrate/validate.py). The config's own traffic is
    the workload `base`; each entry here names another, given as `traffic` keys that replace the
    base's (e.g. longer prompts, a bursty gamma trace). The profiles never see any of them: they are
    fitted on closed bursts, so every cell validate judges is held out by construction."""
    workloads: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,40}$")], dict[str, Any]] = Field(
        default_factory=dict, max_length=16)
    """Held-out workloads: name -> traffic keys replacing the base's."""
    noise: bool = True
    """Run the real backend twice on the same traces (the noise floor)."""
    saturation: bool = True
    """A burst per strategy: throughput where the backend, not the trace, sets it."""
    drift: Literal["apply", "measure", "off"] = "apply"
    """The machine's speed around each workload's runs: a reference burst timed before, between and
    after them, against the profile (validation.drift_against). `apply` scales the workload's
    replays by it where it passes the gate; `measure` records it (accuracy.json's `drift`) and
    leaves the replays as they are; `off` times nothing. `true` is `apply` and `false` `off`.
    `apply`, divided by the fit's replay, by a test fixed before its fresh vLLM session: with the
    live factor and first-token delay on top, a mean of the six median errors of 13.5 % on that
    session against 15.4 % with `measure`, and 13.9 % against 15.7 % over the four latest sessions'
    eight validations, none one-sided (`benchmarks/corrections.py`). Over all sixteen kept
    validations `measure` stays ahead, 13.8 % against 17.2 %: the four oldest sessions ran on a
    slower, loaded host, where three short bursts a workload, gated workload by workload, gave
    workloads side by side different machines; the live factor, read on the other workloads'
    real runs, carries the machine's speed during them either way."""
    drift_against: Literal["profile", "prediction"] = "prediction"
    """What the drift probe's timings are divided by. `prediction`: the profile's own replay of the
    burst, the model every replay uses, so the drift is the machine against the fit's average over
    the whole profile; `profile`: the same burst as timed on the server at the end of its profile
    (where the profile timed it; otherwise the prediction), free of the fit's error at this one
    shape but not of that one moment: a profile whose timing ran 1.30x its own replay read every
    later validation as a faster machine, and applying the probe against it lost a held-out test
    (26.4 % against 12.8 %) where the replay, tried afterwards on the same runs, read 10.7 %."""
    live: bool = True
    """Scale each workload's replays by the live factor: real over replayed p50 TPOT on the *other*
    workloads (closed-burst profiles read below live traffic); needs two workloads or more."""
    order: Literal["workload", "mirrored"] = "workload"
    """`workload`: each workload's runs, rerun and saturation bursts before the next workload's;
    `mirrored`: every workload's first runs in turn, then the reruns (and the rest) in the reverse
    order, so a machine that drifts over the validation moves every workload's two runs alike
    rather than landing on the last workload's."""
    first_token: Literal["delay", "factor", "off"] = "delay"
    """What p50 TTFT still misses on the *other* workloads after the live factor, put into each
    workload's replays: `delay`, seconds added to every request before the scheduler sees it;
    `factor`, a factor on the first-token terms (the prompt's pass, the front end); `off`. Needs
    two workloads. `true` is `factor` (what it meant before there were two forms), `false` `off`."""

    interval: Literal["step-cost", "held-out"] = "held-out"
    """How the 90 % intervals are sized: `held-out`, Student's t times the RMS relative error the
    replays showed on the *other* workloads' cells of the same metric (needs two workloads; with
    one, `step-cost`); `step-cost`, each replay's move when every step cost moves by the fit's
    relative RMS error (and the corrections' standard errors), beside one run's rerun noise.
    `held-out` by a test fixed before its validations ran: on both of a fresh session's (quiet and
    busy) it held closer to 90 % (88.5 and 88.5 %) than step-cost (96.2 and 67.3 %), and over
    twelve vLLM validations 2.2 points off on average against 8.5 (`benchmarks/intervals.py`)."""

    gate: Annotated[float, Field(ge=0, le=10)] = 2.0
    """Apply each correction above (the drift probe's factor, the live factor, the first-token
    factor or delay) only where it lies more than this many of its own standard errors from none;
    0 applies each as measured. One left out still widens the intervals by its standard error.
    2 because a correction the noise cannot tell from none moves the replays by its noise: over three
    held-out vLLM validations gate 2 took the mean of the six median errors from 10.2 to 9.6 %
    (13.6 to 9.2 %, 8.4 to 9.6 %, 8.6 to 10.0 %: `benchmarks/corrections.py --gates 0,2`); it
    drops a real correction too, where one is small against its spread."""

    se_units: Literal["cells", "workloads"] = "workloads"
    """What the live and first-token corrections' standard errors count as independent, for the gate
    and the step-cost intervals: `workloads`, the workloads (the spread of the other workloads' own medians
    over the square root of their number, where that is larger than the cells' error); `cells`,
    every cell they were read on. A correction is carried to a workload it never read, and one
    workload's cells move together, so `cells` can call a correction sure that the next workload
    does not share. `workloads` by a test fixed before its validations were judged: over six vLLM
    validations the mean of the six median errors went from 20.3 to 18.8 % and none turned
    one-sided; on the fresh session that tested it the two tied (20.60 and 20.58 %)
    (`benchmarks/corrections.py --se-units cells,workloads`)."""

    @field_validator("first_token", mode="before")
    @classmethod
    def _first_token_form(cls, v: Any) -> Any:
        return {True: "factor", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("drift", mode="before")
    @classmethod
    def _drift_form(cls, v: Any) -> Any:
        return {True: "apply", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @property
    def drift_timed(self) -> bool:
        """The reference bursts run and their factor is recorded (`apply` or `measure`)."""
        return self.drift != "off"

    @property
    def drift_applied(self) -> bool:
        """The replays are scaled by the reference bursts' factor, where it passes the gate."""
        return self.drift == "apply"

    @field_validator("workloads")
    @classmethod
    def _not_base(cls, v: dict) -> dict:
        if "base" in v:
            raise ValueError("'base' is the config's own traffic; name the held-out workloads otherwise")
        return v


class LoadgenConfig(Model):
    """The load generator that sends a server its trace (backend.kind openai, or a managed
    baseline's points)."""
    workers: Annotated[int, Field(ge=1, le=64)] = 1
    """Processes that send one point's trace, request i by process i mod workers (open loop only):
    past a few hundred streamed requests per second, one process's CPU and not the server sets the pace."""
    kind: Literal["local", "ray"] = "local"
    """Where those processes run: local, on this machine; ray, as Ray actors spread over the
    cluster's nodes (the cluster of executor.kind ray, or $RAY_ADDRESS), their clock offsets measured."""


class RunConfig(Model):
    """One experiment: its traffic, strategies, SLO and output (the backend and the strategies'
    sections come from the registries, see the module docstring)."""
    name: str = identity_role(NO_EFFECT, "batchlab")
    """The experiment's name: results/latest links to results/<name>-<digest>."""
    strategies: list[Strategy] = identity_role(GROWS, default_factory=lambda: ["naive", "dynamic", "continuous"], min_length=1)
    """Batching policies to compare, each on the same traces: naive, dynamic, continuous, priority,
    sjf, vtc (`server` for a backend that batches for itself), or a policy of your own by import path
    (`pkg.module:Class`) or `batchlab.schedulers` entry-point name."""
    traffic: TrafficConfig = TrafficConfig()
    """The requests."""
    slo: SLOConfig = SLOConfig()
    """Latency thresholds for goodput and for what counts as sustained."""
    out: Annotated[str, Field(min_length=1)] = identity_role(NO_EFFECT, "results/latest")
    """The results directory (a path named latest is a link to a directory per experiment)."""
    report: bool = identity_role(NO_EFFECT, True)
    """Write report.md, report.html and the plots at the end of `run`."""
    loadgen: LoadgenConfig = LoadgenConfig()
    """How a server's trace is sent."""
    executor: ExecutorConfig = identity_role(IGNORED, ExecutorConfig())
    """Where points run; never part of what they mean."""
    validation: ValidateConfig = identity_role(IGNORED, ValidateConfig())
    """`batchlab validate` only: held-out workloads."""

    # Dotted keys the user gave (config file and --set, not the packaged defaults): only those
    # can earn a "does not apply" warning. None: not built by load_config; every set field counts.
    _given: frozenset[str] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _strategies_once(self):
        if len(set(self.strategies)) < len(self.strategies):
            raise ValueError(f"strategies: each strategy may be listed once (got {', '.join(self.strategies)})")
        return self

    @model_validator(mode="after")
    def _workloads_are_traffic(self):
        for name, keys in self.validation.workloads.items():
            try:
                TrafficConfig.model_validate(self.traffic.model_dump() | keys)
            except ValidationError as e:
                raise ValueError(f"validation.workloads.{name}: traffic {format_error(e)}") from None
        return self

    def workload(self, name: str) -> RunConfig:
        """This config with workload `name`'s traffic (`base`: as it is), and no validation section."""
        traffic = self.traffic if name == "base" else TrafficConfig.model_validate(
            self.traffic.model_dump() | self.validation.workloads[name])
        return self.model_copy(update={"traffic": traffic, "validation": ValidateConfig()})
