"""An experiment's identity sees every input file wherever it sits in the config: a ShareGPT file
named by a traffic class or by sessions' message lengths is hashed like the trace file is, so a
results directory never resumes with rows drawn from two versions of one file."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SHORT = ["traffic.duration_s=2", "traffic.warmup_s=0", "traffic.rates=[2]", "strategies=[continuous]", "report=false"]


def sharegpt(path, words: int) -> None:
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi " * (words + k)},
                                                   {"from": "gpt", "value": "ok " * (words + k)}]} for k in range(8)]))


def run(out, sets: list[str]) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "batchlab.cli", "run", "--quiet", "--out", str(out)]
    for s in SHORT + sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True)


@pytest.mark.parametrize("where", [
    "traffic.classes=[{{name: a, weight: 1, prompt_len: {{dist: sharegpt, path: {f}}}}}]",
    "traffic.sessions={{turns: 2, think_s: 0.1, message_len: {{dist: sharegpt, path: {f}}}}}",
])
def test_editing_a_file_any_section_reads_starts_another_experiment(tmp_path, where):
    lengths = tmp_path / "lengths.json"
    sharegpt(lengths, 20)
    out = tmp_path / "r"
    first = run(out, [where.format(f=lengths)])
    assert first.returncode == 0, first.stderr
    rows = (out / "requests.csv").read_bytes()
    sharegpt(lengths, 90)                                  # the same path, other lengths
    again = run(out, [where.format(f=lengths), "traffic.rates=[2, 3]"])
    assert again.returncode == 2, again.stdout
    assert "holds another experiment" in again.stderr and "lengths.json" not in again.stderr.split("(")[0]
    assert "input_files.traffic." in again.stderr
    assert (out / "requests.csv").read_bytes() == rows     # nothing mixed in, nothing harmed


# ---- directories recorded before plugins described themselves keep their identities -------------
# tests/run/identity/schema1.json holds, for many configs, the identity, digest, point hashes and
# knobs batchlab computed at commit 253bb33 (when keys were listed by hand), with the input files
# they read placed under its `fixed_dir`; tests/run/identity/recorded/ holds directories that
# version wrote.
GOLDEN = json.loads((Path(__file__).parent / "identity" / "schema1.json").read_text())
EDF = '''from batchlab.schedulers import ContinuousScheduler


class EarliestDeadlineFirst(ContinuousScheduler):
    def next_waiting(self, now):
        return min(self.waiting, key=lambda r: r.arrival_time)
'''


@pytest.fixture(scope="module")
def fixed_files():
    """The input files the recorded configs name, at the absolute paths they were recorded with.
    NOTE: every test worker runs this fixture on the same paths; each file is replaced whole (a
    plain write truncates first, and another worker hashing it then reads an empty file)."""
    from batchlab.core.files import write_atomic
    d = Path(GOLDEN["fixed_dir"])
    d.mkdir(parents=True, exist_ok=True)
    for name, text in GOLDEN["files"].items():
        write_atomic(d / name, text)        # left alone when it already holds the text
    return d


def golden_config(case, tmp_path):
    from batchlab.run.config import load_config, load_user_config
    if case["config_text"] is None:
        return load_user_config(None, case["sets"])
    path = tmp_path / "config.yaml"
    path.write_text(case["config_text"])
    return load_config(path, case["sets"])


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=[c["name"] for c in GOLDEN["cases"]])
def test_every_config_keeps_the_identity_and_point_hashes_it_had(case, fixed_files, tmp_path, monkeypatch):
    from batchlab.run.experiment import digest, identity, knobs, point_hash
    (tmp_path / "my_policy.py").write_text(EDF)                  # the custom-policy case names it
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = golden_config(case, tmp_path)
    assert identity(cfg) == case["experiment"]
    assert digest(identity(cfg)) == case["digest"]
    assert {s: point_hash(cfg, s) for s in cfg.strategies} == case["point_hashes"]
    assert {s: knobs(cfg, s) for s in cfg.strategies} == case["knobs"]


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parent / "identity" / "recorded").iterdir()))
def test_a_directory_recorded_before_resumes_and_grows_with_the_same_hashes(name, fixed_files, tmp_path):
    import csv
    import shutil

    import yaml
    out = tmp_path / name
    shutil.copytree(Path(__file__).parent / "identity" / "recorded" / name, out)
    before = {f: (out / f).read_bytes() for f in ("requests.csv", "summary.csv", "experiment.json")}
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    more = {"traffic.rates": [*recorded["traffic"]["rates"], 2 * max(recorded["traffic"]["rates"])]}
    args = [sys.executable, "-m", "batchlab.cli", "run", str(out / "config.yaml"), "--out", str(out), "--quiet"]
    if recorded["traffic"]["arrival"] != "trace":                 # a replayed trace is one point per repeat
        args += ["--set", f"traffic.rates={more['traffic.rates']}"]
    else:
        args += ["--set", "traffic.repeats=2"]
    res = subprocess.run(args, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (out / "experiment.json").read_bytes() == before["experiment.json"]
    assert (out / "requests.csv").read_bytes().startswith(before["requests.csv"])    # the new points come last
    with (out / "requests.csv").open() as f:
        hashes: dict[str, set[str]] = {}
        for row in csv.DictReader(f):
            hashes.setdefault(row["strategy"], set()).add(row["point_hash"])
    assert all(len(h) == 1 for h in hashes.values()), hashes          # old and new points: one hash per strategy


def test_a_model_directory_is_known_by_its_config_and_a_shape_name_stays_a_name(tmp_path):
    from batchlab.backends.model_shape import bundled
    from batchlab.run.config import load_config
    from batchlab.run.experiment import digest, identity
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(bundled("llama3-8b", "test")["config"]))
    sets = [f"backend.shape={model}", "backend.gpu=H100-SXM"]
    before = digest(identity(load_config(None, sets)))
    (model / "config.json").write_text(json.dumps(bundled("llama3-8b", "test")["config"] | {"num_hidden_layers": 16}))
    assert digest(identity(load_config(None, sets))) != before          # an edited config is another experiment
    named = identity(load_config(None, ["backend.shape=random:llama3-8b", "backend.gpu=H100-SXM"]))
    assert named["backend"]["shape"] == "random:llama3-8b"              # not made a path
