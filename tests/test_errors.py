"""How commands show a user's mistake or a Ctrl-C: one line on stderr and an exit status."""
from __future__ import annotations

import subprocess
import sys

# NOTE: a stand-in for Ctrl-C landing inside asyncio.run while it builds its event loop: an object
# whose finaliser raises and a coroutine never started are both left for the collector at exit.
INTERRUPTED_MID_SETUP = '''
from batchlab.errors import user_errors

class HalfBuilt:
    def __del__(self):
        raise AttributeError("no attribute '_signal_handlers'")

async def never_started():
    pass

@user_errors
def command():
    global left
    left = (HalfBuilt(), never_started())
    raise KeyboardInterrupt

command()
'''


def test_ctrl_c_during_set_up_prints_one_line_and_nothing_from_the_teardown():
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_MID_SETUP], capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 130
    assert lines == ["interrupted: finished points are saved; rerun the same command to resume"], proc.stderr


def test_a_config_error_is_one_line_and_status_2():
    script = "from batchlab.errors import user_errors, ConfigError\n" \
             "user_errors(lambda: (_ for _ in ()).throw(ConfigError('traffic.rates: must be positive')))()\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: traffic.rates: must be positive"
