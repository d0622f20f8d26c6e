"""Other Python processes: Ctrl-C (SIGINT) in one waiting, and one killed while holding."""

from __future__ import annotations

import os
import signal
import time

import redsem
from conftest import Child, wait_until, waiter_ids

WAITER = """
import sys, redsem
sem = redsem.connect(sys.argv[1]).lease_semaphore("busy", 1)
print("waiting", flush=True)
try:
    sem.acquire(timeout=30.0)
    print("granted", flush=True)
except KeyboardInterrupt:
    print("interrupted", len(sem.status()["waiters"]), flush=True)
"""

HOLDER = """
import sys, time, redsem
sem = redsem.connect(sys.argv[1]).lease_semaphore("crash", 1, lease=float(sys.argv[2]))
permit = sem.acquire(timeout=10.0)
print(permit.token, flush=True)
time.sleep(60)
"""


def test_sigint_to_a_waiting_process_raises_keyboard_interrupt_there_and_leaves_the_queue(url):
    sem = redsem.connect(url).lease_semaphore("busy", 1)
    held = sem.try_acquire()
    child = Child(WAITER, url)
    try:
        assert child.line() == "waiting"
        wait_until(lambda: len(waiter_ids(sem)) == 1, timeout=10, what="the child queued")
        child.process.send_signal(signal.SIGINT)
        assert child.line() == "interrupted 0"
        assert child.wait() == 0
        assert waiter_ids(sem) == []
    finally:
        child.kill()
    held.release()
    assert sem.try_acquire() is not None


def test_a_killed_process_permit_comes_back_within_its_lease(url):
    lease = 1.0
    child = Child(HOLDER, url, str(lease))
    try:
        token = int(child.line())
        sem = redsem.connect(url).lease_semaphore("crash", 1, lease=lease)
        assert sem.try_acquire() is None
        os.kill(child.process.pid, signal.SIGKILL)
        killed = time.monotonic()
        child.wait()
        permit = sem.acquire(timeout=10.0)
        waited = time.monotonic() - killed
        assert waited <= lease + 0.5, f"came back after {waited:.2f} s"
        assert permit.token > token
        permit.release()
    finally:
        child.kill()
