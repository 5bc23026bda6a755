"""The deliberate background load: it runs where it is told, and stops with its block."""
import os
import time

import pytest

from batchlab.backends import process
from batchlab.baselines.background import background_load
from batchlab.errors import ConfigError


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_burners_are_pinned_busy_and_gone_after_the_block():
    core = min(os.sched_getaffinity(0))
    with background_load([core], duty=0.5, period_s=0.05) as record:
        (pid,) = record["pids"]
        time.sleep(1.0)
        assert os.sched_getaffinity(pid) == {core} and cpu_seconds(pid) > 0      # it ran
    assert not process.alive(pid)


@pytest.mark.parametrize("cores, duty", [([0], 0.0), ([0], 1.5), ([10_000], 0.5)])
def test_a_load_that_cannot_be_made_is_refused(cores, duty):
    with pytest.raises(ConfigError, match="background load"):
        with background_load(cores, duty):
            pass


def test_the_burners_stop_when_the_process_that_started_them_is_killed():
    """SIGKILL leaves no `finally` to run: the burners notice their parent is gone and end."""
    import signal
    import subprocess
    import sys
    core = min(os.sched_getaffinity(0))
    script = ("import sys, time\nfrom batchlab.baselines.background import background_load\n"
              f"with background_load([{core}], duty=0.2, period_s=0.05) as r:\n"
              "    print(r['pids'][0], flush=True)\n    time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    burner = int(parent.stdout.readline())
    assert process.alive(burner)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while process.alive(burner) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process.alive(burner)
