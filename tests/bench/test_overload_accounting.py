"""bench/overload.py's accounting of where an open loop's goodput goes: a server's CPU split
into its processes' main threads and the rest (a real child process with a busy thread),
and the goodput identity on rows made as `row` makes them (no timing assertions)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench import overload

BUSY = """
import threading, time
def spin(cpu_s):  # until this thread has used cpu_s of CPU, however busy the machine
    while time.thread_time() < cpu_s:
        pass
t = threading.Thread(target=spin, args=(0.4,))
t.start()
spin(0.2)
t.join()
print("done", flush=True)
time.sleep(30)
"""

FRONT = """
import threading, time
spun = threading.Event()
def front():  # named as the native front's tokio threads are (their comm)
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write("seqserve-front")
    while time.thread_time() < 0.3:
        pass
    spun.set()
    time.sleep(30)
threading.Thread(target=front, daemon=True).start()
spun.wait()
print("done", flush=True)
time.sleep(30)
"""


def _cpu_of(script: str) -> tuple[float, float, float]:
    """`server_cpu_s` of a child process running `script`, once it printed "done"."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
        return overload.server_cpu_s(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_servers_cpu_is_split_into_main_threads_the_front_and_the_rest() -> None:
    total, loops, front = _cpu_of(BUSY)
    # /proc counts in 10 ms ticks, sampled: each figure may read up to a few ticks short
    assert 0.55 <= total < 1.5  # 0.6 s spun, and the interpreter's start
    assert 0.17 <= loops < 0.5  # the main thread's share, counted apart
    assert total - loops >= 0.36  # the other thread's (it has ended: its process kept it)
    assert front == 0.0  # no thread of the native front
    assert overload.server_cpu_s(None) == (0.0, 0.0, 0.0)


def test_the_native_fronts_threads_are_counted_by_their_name() -> None:
    total, loops, front = _cpu_of(FRONT)
    assert 0.27 <= front < 0.6, front  # the front thread's 0.3 s spun
    # (the process's figure and each thread's are sampled apart, a tick or two each)
    assert loops < 0.2 and total >= front + loops - 0.03, (total, front, loops)


def fake_row(load: str, ok: int, wall_s: float, server_cpu_s: float, loop_cpu_s: float,
             refused: int = 0, front_cpu_s: float = 0.0) -> dict:
    return {"workload": "classify16", "load": load, "ok": ok, "wall_s": wall_s,
            "ok_per_s": ok / wall_s, "refused": refused,
            "server_cores": server_cpu_s / wall_s, "generator_cores": 0.03,
            "server_cpu_ms_per_ok": 1e3 * server_cpu_s / ok,
            "loop_cpu_ms_per_ok": 1e3 * loop_cpu_s / ok,
            "front_cpu_ms_per_ok": 1e3 * front_cpu_s / ok}


def test_goodput_is_the_cores_times_the_cost_and_refusals_carry_the_loops_rest() -> None:
    cap = fake_row("capacity (closed 32)", ok=5000, wall_s=10.0, server_cpu_s=19.5,
                   loop_cpu_s=6.0)
    over = fake_row("open 3x = 1500/s", ok=6600, wall_s=15.0, server_cpu_s=29.0,
                    loop_cpu_s=10.5, refused=15000, front_cpu_s=1.32)
    a = overload.accounting(cap, over)
    assert a["goodput"] == pytest.approx((6600 / 15) / 500)
    assert a["goodput"] == pytest.approx(a["cores"] * a["cost"])
    assert a["loop_ms"] == pytest.approx((1.2, 1e3 * 10.5 / 6600))
    assert a["front_ms"] == pytest.approx((0.0, 0.2))
    assert a["other_ms"] == pytest.approx((2.7, 1e3 * (18.5 - 1.32) / 6600))
    # the loops' CPU beyond 6,600 admitted requests at 1.2 ms, over 15,000 refusals
    assert a["loop_ms_per_refusal"] == pytest.approx((10.5e3 - 1.2 * 6600) / 15000)
    table = overload.accounting_table([cap, over])
    assert "| classify16 | 0.880 |" in table
    assert overload.accounting_table([cap]) == ""  # no open loop: nothing to account for


def test_a_running_servers_rows_have_no_accounting() -> None:
    """`--url`: the bench did not start the server and read no CPU of it (0 cores): the
    table leaves those rows out instead of dividing by zero."""
    cap = fake_row("capacity (closed 32)", ok=3000, wall_s=6.0, server_cpu_s=0.0,
                   loop_cpu_s=0.0)
    over = fake_row("open 3x = 1500/s", ok=2800, wall_s=12.0, server_cpu_s=0.0,
                    loop_cpu_s=0.0, refused=9000)
    assert overload.accounting_table([cap, over]) == ""
