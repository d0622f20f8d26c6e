"""The blocking API against a real redis-server: grants, contention between threads, FIFO,
timeouts and Ctrl-C leaving the queue, lost leases, the permit semaphore, the latch."""

from __future__ import annotations

import _thread
import threading
import time

import pytest

import redsem
from conftest import assert_tokens_follow_grant_order, wait_until, waiter_ids


def test_a_permit_has_a_token_slots_and_an_id_and_shows_in_the_status(url):
    r = redsem.connect(url)
    sem = r.lease_semaphore("exports", 2, lease=30.0)
    with sem.acquire(timeout=5.0) as permit:
        assert isinstance(permit.token, int) and permit.token > 0
        assert permit.slots == [0]
        assert len(permit.id) == 32 and int(permit.id, 16) >= 0
        assert permit.is_held() and not permit.is_lost()
        assert 29.0 < permit.time_left() <= 30.0
        status = sem.status()
        assert status["name"] == "exports"
        assert status["capacity"] == 2 and status["in_use"] == 1
        (holder,) = status["holders"]
        assert holder["id"] == permit.id and holder["token"] == permit.token
        assert holder["slots"] == [0] and holder["label"] is None
        assert 29_000 < holder["expires_in_ms"] <= 30_000
        assert status["waiters"] == []
        assert status["permits"] == {"available": 0}
        assert status["latch"] == {"state": "never-set", "count": 0}
        second = sem.try_acquire()
        assert second is not None and second.slots == [1] and second.token > permit.token
        assert sem.try_acquire() is None  # busy: None, not an exception
        second.release()
    assert not permit.is_held()
    assert sem.status()["in_use"] == 0


def test_a_second_release_raises_not_held(url):
    sem = redsem.connect(url).lease_semaphore("exports", 1)
    permit = sem.try_acquire()
    permit.release()
    with pytest.raises(redsem.NotHeld) as raised:
        permit.release()
    assert permit.id in str(raised.value) and "not held" in str(raised.value)


def test_releases_from_two_threads_at_once_release_once_while_refreshes_run(url):
    sem = redsem.connect(url).lease_semaphore("exports", 1, lease=30.0)
    permit = sem.try_acquire()
    answers = []
    start = threading.Barrier(4)

    def release():
        start.wait()
        try:
            permit.release()
            answers.append("released")
        except redsem.NotHeld:
            answers.append("not held")

    def refresh():
        start.wait()
        try:
            permit.refresh()
        except (redsem.NotHeld, redsem.LeaseLost):
            pass

    threads = [threading.Thread(target=f) for f in (release, release, refresh, refresh)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10.0)
    assert sorted(answers) == ["not held", "released"]
    assert not permit.is_held() and not permit.is_lost()
    assert sem.status()["in_use"] == 0
    assert sem.try_acquire() is not None


def test_a_permit_released_by_id_elsewhere_raises_not_held_on_release(url):
    r = redsem.connect(url)
    sem = r.lease_semaphore("exports", 1, lease=30.0)
    permit = sem.try_acquire()
    redsem.connect(url).lease_semaphore("exports", 1).release_id(permit.id)
    with pytest.raises(redsem.NotHeld):
        permit.release()
    assert sem.try_acquire() is not None


def test_threads_never_hold_more_than_the_capacity_and_tokens_follow_grant_order(url):
    r = redsem.connect(url)
    sem = r.lease_semaphore("contended", 2, lease=10.0)
    lock = threading.Lock()
    holding = 0
    most = 0
    spans = []  # (acquire called, release returned, token)
    errors = []

    def worker():
        nonlocal holding, most
        try:
            for _ in range(6):
                asked = time.monotonic()
                with sem.acquire(timeout=20.0) as permit:
                    with lock:
                        holding += 1
                        most = max(most, holding)
                    time.sleep(0.005)
                    with lock:
                        holding -= 1
                spans.append((asked, time.monotonic(), permit.token))
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=40)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(spans) == 48
    assert most == 2, "never more than the capacity, and the capacity was reached"
    assert_tokens_follow_grant_order(spans)
    assert sem.status()["in_use"] == 0


def test_waiting_threads_are_served_in_the_order_they_queued(url):
    r = redsem.connect(url)
    sem = r.lease_semaphore("fifo", 1)
    first = sem.try_acquire()
    order = []
    threads = []
    for n in range(5):
        def wait(n=n):
            with sem.acquire(timeout=20.0):
                order.append(n)

        t = threading.Thread(target=wait)
        t.start()
        threads.append(t)
        # The next thread starts only once this one is in the queue.
        wait_until(lambda: len(waiter_ids(sem)) == n + 1, what=f"waiter {n} queued")
    first.release()
    for t in threads:
        t.join(timeout=20)
    assert order == [0, 1, 2, 3, 4]


def test_a_timed_out_acquire_raises_timeout_and_leaves_no_waiter(url):
    sem = redsem.connect(url).lease_semaphore("busy", 1)
    held = sem.try_acquire()
    started = time.monotonic()
    with pytest.raises(redsem.Timeout) as raised:
        sem.acquire(timeout=0.3)
    assert 0.25 < time.monotonic() - started < 3.0
    assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, redsem.Error)
    assert '"busy"' in str(raised.value)
    assert waiter_ids(sem) == []
    held.release()
    # Nobody waits: the unit is free for a try at once.
    assert sem.try_acquire() is not None


def test_ctrl_c_during_a_wait_raises_keyboard_interrupt_and_leaves_no_waiter(url):
    sem = redsem.connect(url).lease_semaphore("busy", 1)
    held = sem.try_acquire()

    def interrupt_once_queued():
        wait_until(lambda: len(waiter_ids(sem)) == 1, what="the waiter queued")
        _thread.interrupt_main()  # as Ctrl-C: SIGINT's handler in the main thread

    threading.Thread(target=interrupt_once_queued, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        sem.acquire(timeout=30.0)
    assert time.monotonic() - started < 10.0
    assert waiter_ids(sem) == []
    held.release()
    assert sem.try_acquire() is not None


def test_other_threads_run_while_one_waits(url):
    """The GIL is released while a call waits: a pure-Python loop makes progress."""
    sem = redsem.connect(url).lease_semaphore("gil", 1)
    held = sem.try_acquire()
    counted = 0
    stop = threading.Event()

    def count():
        nonlocal counted
        while not stop.is_set():
            counted += 1

    t = threading.Thread(target=count)
    t.start()
    with pytest.raises(redsem.Timeout):
        sem.acquire(timeout=0.5)
    before = counted
    time.sleep(0.2)
    stop.set()
    t.join(timeout=5)
    assert before > 1000
    held.release()


def test_a_lost_lease_is_told_in_every_way(url):
    r = redsem.connect(url)
    sem = r.lease_semaphore("lossy", 1, lease=0.3)
    called = threading.Event()
    with pytest.raises(redsem.LeaseLost) as raised:
        with sem.acquire(timeout=5.0) as permit:
            permit.on_lost(called.set)
            assert permit.wait_lost(timeout=0.05) is False  # held: the wait runs out
            # Taken from it: its next renewal (within a third of the lease) finds it gone.
            redsem.connect(url).lease_semaphore("lossy", 1).release_id(permit.id)
            assert permit.wait_lost(timeout=5.0) is True
            assert not permit.is_held() and permit.is_lost()
            assert called.wait(timeout=5.0)
    assert permit.id in str(raised.value)
    assert isinstance(raised.value, redsem.NotHeld)
    late = threading.Event()
    permit.on_lost(late.set)  # lost already: called at once
    assert late.is_set()


def test_a_lease_lost_to_a_frozen_server_ends_in_time(server, url):
    """The server stops answering (SIGSTOP): the permit knows it is lost no later than its
    lease could have ended, without hearing from Redis."""
    import os
    import signal

    sem = redsem.connect(url, response_timeout=0.5).lease_semaphore("frozen", 1, lease=0.6)
    permit = sem.acquire(timeout=5.0)
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        frozen = time.monotonic()
        assert permit.wait_lost(timeout=5.0) is True
        assert time.monotonic() - frozen < 0.6 + 0.5  # the lease, and scheduling slack
        assert not permit.is_held()
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


def test_the_with_block_does_not_hide_its_own_exception(url):
    sem = redsem.connect(url).lease_semaphore("exc", 1, lease=0.3)
    with pytest.raises(ZeroDivisionError):
        with sem.acquire(timeout=5.0) as permit:
            redsem.connect(url).lease_semaphore("exc", 1).release_id(permit.id)
            assert permit.wait_lost(timeout=5.0)
            1 / 0
    assert sem.try_acquire() is not None


def test_a_permit_released_inside_its_block_is_left_alone_at_the_end(url):
    sem = redsem.connect(url).lease_semaphore("early", 1)
    with sem.acquire(timeout=5.0) as permit:
        permit.release()
        assert not permit.is_held()
        assert permit.wait_lost(timeout=1.0) is False  # released, not lost
    assert sem.try_acquire() is not None


def test_a_garbage_collected_permit_is_released_in_the_background(url):
    r = redsem.connect(url)
    sem = r.lease_semaphore("dropped", 1)
    permit = sem.try_acquire()
    assert permit is not None
    del permit
    r.flush(timeout=5.0)
    assert sem.status()["in_use"] == 0


def test_many_units_at_once(url):
    sem = redsem.connect(url).lease_semaphore("many", 3)
    with sem.acquire(2, timeout=5.0) as two:
        assert sorted(two.slots) == [0, 1]
        assert sem.try_acquire(2) is None
        one = sem.try_acquire()
        assert one.slots == [2]
        one.release()


def test_the_mutex_admits_one(url):
    lock = redsem.connect(url).mutex("ledger")
    with lock.lock(timeout=5.0) as guard:
        assert lock.try_lock() is None
        assert guard.slots == [0]
        with pytest.raises(redsem.Timeout):
            lock.lock(timeout=0.2)
    assert lock.try_lock() is not None


def permit_queue(server, name):
    """The requests queued on a permit semaphore, read from its queue key."""
    return server.command("ZCARD", "redsem:{permits:%s}:queue" % name)


def test_permit_semaphore_counts_and_times_out_without_leaving_a_waiter(server, url):
    r = redsem.connect(url)
    gpu = r.permit_semaphore("gpu")
    assert gpu.available_permits() == 0
    assert gpu.try_set_permits(4) is True
    assert gpu.try_set_permits(7) is False
    gpu.acquire(2, timeout=1.0)
    assert gpu.available_permits() == 2
    assert gpu.try_acquire(3) is False
    assert gpu.try_acquire(2) is True
    with pytest.raises(redsem.Timeout):
        gpu.acquire(1, timeout=0.3)
    assert permit_queue(server, "gpu") == 0
    gpu.release(2)
    # A try fails while anyone waits: it succeeds, so the timed-out request left the queue.
    assert gpu.try_acquire(1) is True
    gpu.release(3)
    assert gpu.available_permits() == 4
    gpu.add_permits(-6)
    assert gpu.available_permits() == -2
    assert r.lease_semaphore("gpu", 1).status()["permits"] == {"available": -2}


def test_permit_semaphore_waiters_are_served_fifo_across_threads(server, url):
    pool = redsem.connect(url).permit_semaphore("pool")
    pool.try_set_permits(0)
    order = []
    threads = []
    for n, wanted in enumerate([2, 1, 1]):
        def wait(n=n, wanted=wanted):
            pool.acquire(wanted, timeout=20.0)
            order.append(n)

        t = threading.Thread(target=wait)
        t.start()
        threads.append(t)
        # The next thread starts only once this one is in the queue.
        wait_until(lambda: permit_queue(server, "pool") == n + 1, what=f"waiter {n} queued")
    pool.release(1)  # not enough for the head (2): nobody behind it may overtake it
    time.sleep(0.3)
    assert order == []
    # Each further permit serves the next in line, and only it.
    for served in ([0], [0, 1], [0, 1, 2]):
        pool.release(1)
        wait_until(lambda: order == served, what=f"served {served}")
    for t in threads:
        t.join(timeout=20)
    assert pool.available_permits() == 0


def test_the_latch_opens_every_waiter_at_zero(url):
    r = redsem.connect(url)
    latch = r.count_down_latch("ready")
    assert latch.state() == {"state": "never-set", "count": 0}
    assert latch.try_set_count(3) is True
    assert latch.count_down() == 2  # the count-downs it left
    assert latch.count() == 2
    assert latch.state() == {"state": "counting", "count": 2}
    with pytest.raises(redsem.Timeout):
        latch.wait(timeout=0.2)
    opened = []
    waiters = [threading.Thread(target=lambda: (latch.wait(timeout=10.0), opened.append(1))) for _ in range(3)]
    for t in waiters:
        t.start()
    time.sleep(0.1)
    assert opened == []
    assert latch.count_down() == 1
    assert latch.count_down() == 0  # this one opened it
    for t in waiters:
        t.join(timeout=10)
    assert opened == [1, 1, 1]
    assert latch.state() == {"state": "open", "count": 0}
    latch.wait(timeout=1.0)  # open: at once
    assert latch.count_down() is None  # not counting: nothing done
