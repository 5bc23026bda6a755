"""Faults this suite found outside the server, the executor and the report, kept as the checks that
they stay fixed: an output path refused before any work, a result file a kill mid-write leaves
whole, booleans and an empty out refused in one line."""
from __future__ import annotations

import json

import pytest

from tests.faults.conftest import one_error_line, run
from tests.server.conftest import ServeProcess

SWEEP = ["run", "--quiet", "--set", "traffic.rates=[4]", "--set", "traffic.duration_s=5", "--set", "traffic.warmup_s=1",
         "--set", "report=false"]
TUNE = ["tune", "--slo", "ttft_p99=1s", "--set", "traffic.rates=[10]", "--set", "backend.preset=toy",
                 "--set", "traffic.duration_s=10", "--max-cap", "64"]
CAPACITY = ["capacity", "--set", "strategies=[continuous]", "--set", "traffic.duration_s=10", "--set", "traffic.warmup_s=1",
            "--set", "traffic.rates=[2, 16]"]


@pytest.fixture(scope="module")
def server():
    with ServeProcess() as s:
        yield s


def files_in(path) -> set[str]:
    return {p.name for p in path.iterdir()}


@pytest.mark.parametrize("command", [TUNE, CAPACITY], ids=["tune", "capacity"])
def test_an_output_path_under_a_file_is_refused_before_the_work(tmp_path, command):
    (tmp_path / "afile").write_text("")
    status, _, err = run(*command, "--out", str(tmp_path / "afile" / "out"))
    assert status == 2 and "afile" in one_error_line(err)


def test_loadtest_refuses_an_output_path_under_a_file_before_the_load(tmp_path, server):
    (tmp_path / "afile").write_text("")
    status, _, err = run("loadtest", server.url + "/v1", "--concurrency", "1", "--per-user", "1", "--output-len", "4",
                         "--out", str(tmp_path / "afile" / "load.json"))
    assert status == 2 and "afile" in one_error_line(err)


def test_a_boolean_where_a_number_belongs_is_refused(tmp_path):
    status, _, err = run(*SWEEP, "--out", str(tmp_path / "r"), "--set", "traffic.duration_s=true")
    assert status == 2 and "traffic.duration_s" in one_error_line(err) and not (tmp_path / "r").exists()


@pytest.mark.parametrize("key", ["traffic.rates=[true]", "traffic.rates=[5, false]", "continuous.max_num_seqs=true"])
def test_a_boolean_in_a_list_or_section_is_refused_too(key):
    from batchlab.errors import ConfigError
    from batchlab.run.config import load_config
    with pytest.raises(ConfigError, match=key.split("=")[0].replace(".", r"\.")):
        load_config(None, [key])


def test_an_empty_out_is_refused_and_nothing_lands_in_the_working_directory(tmp_path):
    status, _, err = run(*SWEEP, "--set", "out=", cwd=tmp_path)
    assert status == 2 and "out" in one_error_line(err) and files_in(tmp_path) == set()


def killed_writing(tmp_path, command: list[str], written) -> None:
    """Run `command` over a previous result at `written`, killed halfway through writing the new
    one: the previous result must still be readable."""
    written.write_text('{"a previous result": true}\n')
    run(*command, fault=f"killed-writing-{written.name}")
    assert json.loads(written.read_text()) == {"a previous result": True}


def test_tune_killed_while_writing_keeps_the_previous_tune_json(tmp_path):
    killed_writing(tmp_path, [*TUNE, "--out", str(tmp_path)], tmp_path / "tune.json")


def test_capacity_killed_while_writing_keeps_the_previous_capacity_json(tmp_path):
    killed_writing(tmp_path, [*CAPACITY, "--out", str(tmp_path)], tmp_path / "capacity.json")


def test_profile_killed_while_writing_keeps_the_previous_profile(tmp_path):
    killed_writing(tmp_path, ["profile", "--preset", "toy", "--out", str(tmp_path / "p.json")], tmp_path / "p.json")


def test_loadtest_killed_while_writing_keeps_the_previous_result(tmp_path, server):
    command = ["loadtest", server.url + "/v1", "--concurrency", "1", "--per-user", "2", "--output-len", "4",
               "--out", str(tmp_path / "load.json")]
    killed_writing(tmp_path, command, tmp_path / "load.json")
