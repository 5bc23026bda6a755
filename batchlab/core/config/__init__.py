"""Config sections, split by what they describe; run/config.py assembles the whole run's model.

base.py: the strict model, identity roles, one-line errors; load.py: YAML and --set into a tree;
traffic.py: arrivals, lengths, classes, sessions, the SLO; run.py: the sections every run has.
"""
from batchlab.core.config.base import (
    GROWS,
    IGNORED,
    INPUT_FILE,
    NO_EFFECT,
    Model,
    field_role,
    format_error,
    identity_role,
    one_line,
)
from batchlab.core.config.run import STRATEGY_PATTERN, ExecutorConfig, RunConfig, Strategy, ValidateConfig
from batchlab.core.config.traffic import (
    LengthDist,
    PrefixConfig,
    RateStep,
    ReplayConfig,
    SessionsConfig,
    SLOConfig,
    TrafficClass,
    TrafficConfig,
    as_length,
)

__all__ = ["GROWS", "IGNORED", "INPUT_FILE", "NO_EFFECT", "STRATEGY_PATTERN", "ExecutorConfig", "LengthDist", "Model",
           "PrefixConfig", "RateStep", "ReplayConfig", "RunConfig", "SLOConfig", "SessionsConfig", "Strategy",
           "TrafficClass", "TrafficConfig", "ValidateConfig", "as_length", "field_role", "format_error", "one_line",
           "identity_role"]
