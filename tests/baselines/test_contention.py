"""Contention from the kernel's books: others' share of a server's cores, on a fake /proc and a real one."""
import os
import subprocess
import sys
import time

import pytest

from batchlab.baselines.contention import Books, Usage, contention, host_speed, others_share, read, stolen_s, usage

TICK = os.sysconf("SC_CLK_TCK")


def fake_proc(root, busy_ticks: dict[int, int], groups: dict[int, tuple[int, ...]]):
    """A /proc with per-core busy ticks (idle 1000 each) and processes pid -> (pgrp, utime, stime[, minflt])."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{c} {b} 0 0 1000 7 0 0 0 0 0" for c, b in busy_ticks.items()]
    (root / "stat").write_text("\n".join(lines) + "\n")
    for pid, (pgrp, ut, st, *flt) in groups.items():
        (root / str(pid)).mkdir(exist_ok=True)
        # the name may hold spaces and parentheses: fields are counted after its last ')'
        minflt = flt[0] if flt else 0
        (root / str(pid) / "stat").write_text(f"{pid} (a (b) c) S 1 {pgrp} {pgrp} 0 -1 0 {minflt} 0 0 0 {ut} {st} 0 0 20 0\n")


def test_the_share_is_the_cores_busy_time_less_the_servers_own(tmp_path):
    fake_proc(tmp_path, {0: 500, 1: 100}, {10: (10, 30, 10), 11: (10, 20, 0), 12: (99, 500, 500)})
    a = read([1], 10, tmp_path)
    assert a.busy_s == pytest.approx(100 / TICK) and a.server_s == pytest.approx(60 / TICK)   # pid 12 is another group
    b = Books(a.at + 1.0, a.busy_s + 0.9, a.server_s + 0.5)
    assert others_share(a, b, 1) == pytest.approx(0.4)
    assert others_share(a, Books(a.at + 2.0, a.busy_s + 0.9, a.server_s + 0.5), 1) == pytest.approx(0.2)
    assert others_share(a, Books(a.at + 1.0, a.busy_s + 0.5, a.server_s + 0.9), 1) == 0.0   # clamped, never negative


def test_usage_sums_the_groups_cpu_and_first_touches(tmp_path):
    fake_proc(tmp_path, {0: 0}, {10: (10, 30, 10, 500), 11: (10, 20, 4, 70), 12: (99, 500, 500, 9999)})
    u = usage(10, tmp_path)
    assert u == Usage(50 / TICK, 14 / TICK, 570)                       # pid 12 is another group
    d = Usage(u.user_s + 1.0, u.system_s + 0.5, 1570).since(u)
    assert (d.user_s, d.system_s, d.minor_faults) == (pytest.approx(1.0), pytest.approx(0.5), 1000)


def test_steal_is_read_from_the_first_line_of_stat(tmp_path):
    (tmp_path / "stat").write_text(f"cpu  10 0 5 900 3 0 0 {2 * TICK} 0 0\ncpu0 10 0 5 900 3 0 0 {2 * TICK} 0 0\n")
    assert stolen_s(tmp_path) == pytest.approx(2.0)


def test_the_host_speed_probe_times_both_pieces_of_work():
    got = host_speed(repeats=3)
    assert set(got) == {"python_s", "matmul_s"} and all(v > 0 for v in got.values())


def test_no_proc_measures_nothing(tmp_path):
    assert usage(1, tmp_path / "absent") is None and stolen_s(tmp_path / "absent") is None
    with contention([0], 1, tmp_path / "absent") as found:
        pass
    assert found == {}


@pytest.mark.skipif(not os.path.exists("/proc/stat") or not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_a_job_burning_a_core_is_counted_against_a_server_that_is_not_it():
    """A busy loop on core 0 for the window, beside a "server" that only sleeps (a process group of
    its own): core 0 is busy the whole window and the server takes none of it, so nearly all of it
    is others' (loosely bounded: whatever else runs on core 0 is others' too)."""
    burner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"],
                              start_new_session=True)
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"], start_new_session=True)
    try:
        os.sched_setaffinity(burner.pid, {0})
        time.sleep(0.3)
        with contention([0], server.pid) as found:
            time.sleep(1.0)
    finally:
        for p in (burner, server):
            p.kill()
            p.wait()
    assert found["others_share"] > 0.5 and found["factor"] == pytest.approx(1 / (1 - found["others_share"]))
