"""redsem.aio against a real redis-server: tasks contending, FIFO, timeouts and cancellation
leaving the queue, a lost lease, the permit semaphore and the latch."""

from __future__ import annotations

import asyncio
import time

import pytest

import redsem
import redsem.aio
from conftest import assert_tokens_follow_grant_order


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=50))


async def waiters(sem) -> list:
    return [w["id"] for w in (await sem.status())["waiters"]]


async def until(predicate, timeout: float = 5.0, what: str = "condition"):
    end = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > end:
            pytest.fail(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.01)


def test_async_with_acquire_gives_a_permit_and_releases_it(url):
    async def main():
        r = await redsem.aio.connect(url)
        sem = r.lease_semaphore("exports", 2)
        async with sem.acquire(timeout=5.0) as permit:
            assert isinstance(permit, redsem.aio.Permit)
            assert permit.slots == [0] and len(permit.id) == 32 and permit.is_held()
            status = await sem.status()
            assert status["in_use"] == 1 and status["holders"][0]["token"] == permit.token
            other = await sem.try_acquire()
            assert other is not None and other.token > permit.token
            assert await sem.try_acquire() is None
            await other.release()
            with pytest.raises(redsem.NotHeld):
                await other.release()
        assert not permit.is_held()
        assert (await sem.status())["in_use"] == 0
        permit = await sem.acquire()  # awaited rather than entered
        await permit.release()

    run(main())


def test_tasks_never_hold_more_than_the_capacity_and_tokens_follow_grant_order(url):
    async def main():
        r = await redsem.aio.connect(url)
        sem = r.lease_semaphore("contended", 2, lease=10.0)
        holding = 0
        most = 0
        spans = []

        async def worker():
            nonlocal holding, most
            for _ in range(6):
                asked = time.monotonic()
                async with sem.acquire(timeout=20.0) as permit:
                    holding += 1
                    most = max(most, holding)
                    await asyncio.sleep(0.005)
                    holding -= 1
                spans.append((asked, time.monotonic(), permit.token))

        await asyncio.gather(*(worker() for _ in range(10)))
        assert most == 2
        assert len(spans) == 60
        assert_tokens_follow_grant_order(spans)
        assert (await sem.status())["in_use"] == 0

    run(main())


def test_waiting_tasks_are_served_in_the_order_they_queued(url):
    async def main():
        r = await redsem.aio.connect(url)
        sem = r.lease_semaphore("fifo", 1)
        first = await sem.try_acquire()
        order = []

        async def wait(n):
            async with sem.acquire(timeout=20.0):
                order.append(n)

        tasks = []
        for n in range(5):
            tasks.append(asyncio.create_task(wait(n)))
            await until(lambda: _count(sem, n + 1), what=f"task {n} queued")
        await first.release()
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3, 4]

    async def _count(sem, n):
        return len(await waiters(sem)) == n

    run(main())


def test_a_timed_out_acquire_raises_timeout_and_leaves_no_waiter(url):
    async def main():
        r = await redsem.aio.connect(url)
        sem = r.lease_semaphore("busy", 1)
        held = await sem.try_acquire()
        with pytest.raises(redsem.Timeout):
            await sem.acquire(timeout=0.3)
        assert await waiters(sem) == []
        with pytest.raises(redsem.Timeout):
            async with sem.acquire(timeout=0.2):
                pytest.fail("granted while held")
        assert await waiters(sem) == []
        await held.release()

    run(main())


def test_a_cancelled_task_leaves_the_queue(url):
    async def main():
        r = await redsem.aio.connect(url)
        sem = r.lease_semaphore("busy", 1)
        held = await sem.try_acquire()
        task = asyncio.create_task(sem.acquire(timeout=30.0).__aenter__())

        async def queued():
            return len(await waiters(sem)) == 1

        await until(queued, what="the task queued")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The cancellation went on only once the request had left the queue.
        assert await waiters(sem) == []
        # asyncio.wait_for cancels the same way.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(sem.acquire(), timeout=0.3)
        assert await waiters(sem) == []
        await held.release()
        assert await sem.try_acquire() is not None

    run(main())


def test_a_lost_lease_ends_lost_and_the_block_raises_lease_lost(url):
    async def main():
        r = await redsem.aio.connect(url)
        sem = r.lease_semaphore("lossy", 1, lease=0.3)
        with pytest.raises(redsem.LeaseLost):
            async with sem.acquire(timeout=5.0) as permit:
                lost = asyncio.create_task(permit.lost())
                await asyncio.sleep(0.05)
                assert not lost.done()
                await r.lease_semaphore("lossy", 1).release_id(permit.id)
                assert await asyncio.wait_for(lost, timeout=5.0) is True
                assert not permit.is_held() and permit.is_lost()
        other = await sem.acquire(timeout=5.0)
        ended = asyncio.create_task(other.lost())
        await other.release()
        assert await asyncio.wait_for(ended, timeout=5.0) is False  # released, not lost

    run(main())


def test_permit_semaphore_and_latch_await(url):
    async def main():
        r = await redsem.aio.connect(url)
        gpu = r.permit_semaphore("gpu")
        assert await gpu.try_set_permits(4) is True
        await gpu.acquire(2, timeout=1.0)
        assert await gpu.available_permits() == 2
        with pytest.raises(redsem.Timeout):
            await gpu.acquire(3, timeout=0.2)
        assert await gpu.try_acquire(2) is True  # the timed-out request left the queue
        await gpu.release(4)
        assert await gpu.available_permits() == 4

        latch = r.count_down_latch("ready")
        assert await latch.try_set_count(2) is True
        waiting = asyncio.create_task(latch.wait(timeout=10.0))
        await latch.count_down()
        assert await latch.count() == 1
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await latch.count_down()
        await asyncio.wait_for(waiting, timeout=10.0)
        assert await latch.state() == {"state": "open", "count": 0}
        assert await latch.try_set_count(1) is True  # an opened latch can be set again
        with pytest.raises(redsem.Timeout):
            await latch.wait(timeout=0.2)

    run(main())


def test_the_event_loop_runs_while_a_call_waits(url):
    async def main():
        r = await redsem.aio.connect(url)
        sem = r.lease_semaphore("loop", 1)
        held = await sem.try_acquire()
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        with pytest.raises(redsem.Timeout):
            await sem.acquire(timeout=0.5)
        ticker.cancel()
        assert ticks >= 20
        await held.release()

    run(main())


def test_the_native_engine_without_the_module_is_engine_unavailable(server, url):
    async def main():
        with pytest.raises(redsem.EngineUnavailable, match=f"127.0.0.1:{server.port}"):
            await redsem.aio.connect(url, engine="native")
        r = await redsem.aio.connect(url, engine="auto")
        assert r.engine == "scripts"
        async with r.lease_semaphore("jobs", 1).acquire(timeout=5.0) as permit:
            assert permit.is_held()

    run(main())
