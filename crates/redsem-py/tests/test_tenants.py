"""Tenants: ``acquire(tenant=..., weight=..., cap=...)`` and ``try_acquire(tenant=...)`` on the
lease semaphore and the mutex, blocking and in ``redsem.aio``; fair shares between tenants,
caps, ``status()``'s ``tenants``, and ``redsem.TenantConflict``."""

from __future__ import annotations

import asyncio
import time

import pytest

import redsem
import redsem.aio


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=50))


def tenant(status, name):
    found = [t for t in status.get("tenants", []) if t["name"] == name]
    assert found, f"no tenant {name!r} in {status}"
    return found[0]


def test_a_tenant_s_permit_shows_in_status_with_its_weight_and_cap(url):
    r = redsem.connect(url)
    sem = r.lease_semaphore("llm", 3)
    plain = sem.acquire(timeout=5.0)
    assert "tenants" not in sem.status(), "no tenants field while none is named"
    permit = sem.acquire(tenant="acme", weight=2, cap=1, timeout=5.0)
    status = sem.status()
    assert tenant(status, "acme") == {
        "name": "acme",
        "held": 1,
        "waiters": 0,
        "weight": 2,
        "cap": 1,
    }
    assert tenant(status, "")["held"] == 1 and tenant(status, "")["cap"] is None
    assert [h.get("tenant") for h in status["holders"]] == [None, "acme"]
    # acme is at its cap: refused although a unit is free; another tenant gets it.
    assert sem.try_acquire(tenant="acme", weight=2, cap=1) is None
    other = sem.try_acquire(tenant="beta")
    assert other is not None
    for p in (permit, other, plain):
        p.release()
    assert "tenants" not in sem.status()


def test_a_tenant_named_with_other_settings_raises_tenant_conflict(url):
    r = redsem.connect(url)
    sem = r.lease_semaphore("llm", 4)
    held = sem.acquire(tenant="acme", weight=2, timeout=5.0)
    with pytest.raises(redsem.TenantConflict) as raised:
        sem.acquire(tenant="acme", weight=3, timeout=1.0)
    assert "acme" in str(raised.value)
    with pytest.raises(redsem.TenantConflict):
        sem.try_acquire(tenant="acme", cap=2)
    mutex = r.mutex("deploy")
    with mutex.acquire(tenant="ops", cap=1, timeout=5.0):
        assert tenant(mutex.status(), "ops")["cap"] == 1
        with pytest.raises(redsem.TenantConflict):
            mutex.try_lock(tenant="ops")
    assert issubclass(redsem.TenantConflict, redsem.Error)
    assert redsem.aio.TenantConflict is redsem.TenantConflict
    held.release()
    assert sem.status()["in_use"] == 0


def test_weight_or_cap_without_a_tenant_or_out_of_range_is_refused(url):
    r = redsem.connect(url)
    sem = r.lease_semaphore("llm", 2)
    for kwargs in (
        {"weight": 2},
        {"cap": 1},
        {"tenant": ""},
        {"tenant": "a", "weight": 0},
        {"tenant": "a", "weight": 1_000_001},
        {"tenant": "a", "cap": 0},
        {"tenant": "x" * 257},
    ):
        with pytest.raises(redsem.InvalidArgument):
            sem.acquire(timeout=1.0, **kwargs)
        with pytest.raises(ValueError):
            sem.try_acquire(**kwargs)
    assert sem.status()["in_use"] == 0


def test_a_quiet_tenant_is_served_before_a_flooding_tenant_s_backlog(url):
    async def main():
        r = await redsem.aio.connect(url)
        sem = r.lease_semaphore("shares", 2, lease=10.0)
        held = [await sem.acquire(tenant="flood", timeout=5.0) for _ in range(2)]
        served = []

        async def one(name):
            async with sem.acquire(tenant=name, timeout=10.0):
                served.append(name)

        tasks = []
        for i, name in enumerate(["flood", "flood", "flood", "quiet"]):
            tasks.append(asyncio.create_task(one(name)))
            end = time.monotonic() + 5.0
            while len((await sem.status())["waiters"]) != i + 1:
                assert time.monotonic() < end, "the request did not queue"
                await asyncio.sleep(0.01)
        status = await sem.status()
        assert [w.get("tenant") for w in status["waiters"]] == ["flood"] * 3 + ["quiet"]
        assert tenant(status, "quiet")["waiters"] == 1
        # One unit comes free while flood still holds the other: quiet holds none, so it is
        # next (plain FIFO would serve it last).
        await held.pop(0).release()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10.0)
        assert served == ["quiet", "flood", "flood", "flood"]
        await held[0].release()

    run(main())


def test_the_asyncio_mutex_and_try_acquire_take_a_tenant(url):
    async def main():
        r = await redsem.aio.connect(url)
        mutex = r.mutex("nightly")
        async with mutex.lock(tenant="ops", weight=3, timeout=5.0):
            status = await mutex.status()
            assert tenant(status, "ops")["weight"] == 3
            assert await mutex.try_lock(tenant="batch") is None
            with pytest.raises(redsem.TenantConflict):
                await mutex.try_acquire(tenant="ops")
        sem = r.lease_semaphore("llm", 2)
        permit = await sem.try_acquire(tenant="acme", cap=1)
        assert permit is not None
        assert await sem.try_acquire(tenant="acme", cap=1) is None
        assert tenant(await sem.status(), "acme")["held"] == 1
        await permit.release()
        with pytest.raises(redsem.InvalidArgument):
            await sem.acquire(weight=2)

    run(main())
