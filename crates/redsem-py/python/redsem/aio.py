"""redsem for asyncio: the names of :mod:`redsem`, awaitable.

>>> import redsem.aio
>>> async def main():
...     r = await redsem.aio.connect("redis://127.0.0.1:6379")
...     sem = r.lease_semaphore("exports", 2)
...     async with sem.acquire(timeout=5.0) as permit:
...         print(permit.token)

The calls run on the Rust library's runtime, not on the event loop: awaiting one costs the
loop nothing while Redis answers. Cancelling a waiting task (``task.cancel()``,
``asyncio.wait_for``, ``asyncio.timeout``) drops the Rust request, and the cancellation goes
on once the request has left the queue (at most 5 s when Redis cannot be reached; then the
withdrawal carries on in the background).
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, Awaitable, Callable, Dict, Generator, List, Optional, Tuple, Type

from . import _redsem
from . import _errors
from ._errors import *  # noqa: F403 (every exception, listed in _errors.__all__)

__all__ = [
    "connect",
    "Redsem",
    "LeaseSemaphore",
    "Mutex",
    "Permit",
    "PermitSemaphore",
    "CountDownLatch",
] + _errors.__all__


async def _wait(started: Tuple[Awaitable[Any], Any]) -> Any:
    """Await a native wait; if cancelled, let the cancellation go on only once the Rust
    request was dropped and its withdrawal sent."""
    awaitable, settle = started
    try:
        return await awaitable
    except asyncio.CancelledError:
        await settle.wait()
        raise


class Permit:
    """A permit of a lease semaphore, renewed in the background while it lives.

    ``async with sem.acquire() as permit:`` releases it at the end of the block; else call
    ``await permit.release()``. Pass ``token`` to the resource you protect.
    """

    __slots__ = ("_native",)

    def __init__(self, native: _redsem.Permit) -> None:
        self._native = native

    @property
    def id(self) -> str:
        """The permit id: 32 hex digits."""
        return self._native.id

    @property
    def token(self) -> int:
        """The fencing token of this grant: larger than every earlier grant's."""
        return self._native.token

    @property
    def slots(self) -> List[int]:
        """The slots of this permit, one per unit."""
        return self._native.slots

    @property
    def slot(self) -> int:
        """The first (lowest) slot."""
        return self._native.slot

    @property
    def semaphore(self) -> str:
        """The name of its semaphore."""
        return self._native.semaphore

    def is_held(self) -> bool:
        """True while known held: not released, not lost, lease not possibly ended."""
        return self._native.is_held()

    def owned(self) -> bool:
        """redis-py's name for ``is_held()``: True while this permit is held by us."""
        return self._native.owned()

    def is_lost(self) -> bool:
        """True once the lease was lost; false while held and after a release."""
        return self._native.is_lost()

    def time_left(self) -> float:
        """Seconds the lease is certain to last without another renewal."""
        return self._native.time_left()

    async def release(self) -> None:
        """Release the permit; raises ``NotHeld`` if it was not held any more. Cancelling
        the awaiting task does not cancel the release: it goes on in the background."""
        await self._native.release_async()

    async def refresh(self) -> None:
        """Renew the lease now; raises ``LeaseLost`` if it was lost."""
        await self._native.refresh_async()

    async def lost(self) -> bool:
        """Return when the lease is lost (True) or the permit is released (False)."""
        return await self._native.lost_async()

    def on_lost(self, callback: Callable[[], Any]) -> None:
        """Call ``callback()`` once if the lease is lost (from a background thread; use
        ``loop.call_soon_threadsafe`` inside it to reach the event loop)."""
        self._native.on_lost(callback)

    async def __aenter__(self) -> "Permit":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        # Never swallows the block's exception (so typed None, not bool: a type checker
        # then knows the code after the block is reached only through it).
        await self._native.exit_async(exc_type is None)

    def __repr__(self) -> str:
        return repr(self._native).replace("redsem.Permit", "redsem.aio.Permit", 1)


class _Acquire:
    """What ``acquire()`` returns: await it for a ``Permit``, or use it with ``async with``."""

    __slots__ = ("_start", "_permit")

    def __init__(self, start: Callable[[], Tuple[Awaitable[Any], Any]]) -> None:
        self._start = start
        self._permit: Optional[Permit] = None

    async def _acquire(self) -> Permit:
        return Permit(await _wait(self._start()))

    def __await__(self) -> Generator[Any, None, Permit]:
        return self._acquire().__await__()

    async def __aenter__(self) -> Permit:
        self._permit = await self._acquire()
        return self._permit

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        assert self._permit is not None
        await self._permit.__aexit__(exc_type, exc, tb)


def _permit(native: Optional[_redsem.Permit]) -> Optional[Permit]:
    return None if native is None else Permit(native)


class LeaseSemaphore:
    """A fair counting semaphore whose permits are leases (see ``redsem.LeaseSemaphore``)."""

    __slots__ = ("_native",)

    def __init__(self, native: _redsem.LeaseSemaphore) -> None:
        self._native = native

    @property
    def name(self) -> str:
        """The semaphore's name."""
        return self._native.name

    @property
    def capacity(self) -> int:
        """The capacity this handle asks for."""
        return self._native.capacity

    def acquire(
        self,
        units: int = 1,
        *,
        timeout: Optional[float] = None,
        blocking: bool = True,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> _Acquire:
        """Wait in line (FIFO) for ``units`` units: ``await`` it for a ``Permit``, or
        ``async with`` it. Raises ``redsem.Timeout`` when ``timeout`` seconds run out
        (``None`` or ``float("inf")``: no limit). ``blocking=False``: take them only if free
        and nobody waits, else raise ``redsem.NoPermit``. ``tenant``, ``weight``, ``cap``:
        the request is that tenant's, in fair shares (see ``redsem.LeaseSemaphore.acquire``).
        """
        return _Acquire(
            lambda: self._native.acquire_async(units, timeout, blocking, tenant, weight, cap)
        )

    async def try_acquire(
        self,
        units: int = 1,
        *,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> Optional[Permit]:
        """A ``Permit`` if ``units`` are free and nobody waits, else None."""
        return _permit(await self._native.try_acquire_async(units, tenant, weight, cap))

    async def status(self) -> Dict[str, Any]:
        """The status JSON of the CLI, as a dict (see ``redsem.LeaseSemaphore.status``)."""
        return await self._native.status_async()

    async def set_capacity(self, capacity: int) -> Optional[int]:
        """Store a new capacity; returns the previous one, or None."""
        return await self._native.set_capacity_async(capacity)

    async def locked(self) -> bool:
        """True when some permit holds a unit now (one round trip)."""
        return await self._native.locked_async()

    async def release_id(self, id: str) -> None:
        """Release the permit ``id`` held by any process (or withdraw the request ``id``)."""
        await self._native.release_id_async(id)

    async def refresh_id(self, id: str, lease: float) -> None:
        """Extend the lease of the permit ``id``, held by any process, to ``lease`` seconds;
        ``ValueError`` when that would shorten it."""
        await self._native.refresh_id_async(id, lease)

    def __repr__(self) -> str:
        return repr(self._native).replace("redsem.", "redsem.aio.", 1)


class Mutex:
    """A distributed mutex: a fair lease semaphore of capacity 1."""

    __slots__ = ("_native",)

    def __init__(self, native: _redsem.Mutex) -> None:
        self._native = native

    @property
    def name(self) -> str:
        """The mutex's name."""
        return self._native.name

    def acquire(
        self,
        *,
        timeout: Optional[float] = None,
        blocking: bool = True,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> _Acquire:
        """Wait in line for the lock: ``await`` it for a ``Permit``, or ``async with`` it.
        ``blocking=False``: take it only if free, else raise ``redsem.NoPermit``.
        ``tenant``, ``weight``, ``cap``: as for ``LeaseSemaphore.acquire``."""
        return _Acquire(
            lambda: self._native.lock_async(timeout, blocking, tenant, weight, cap)
        )

    def lock(
        self,
        *,
        timeout: Optional[float] = None,
        blocking: bool = True,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> _Acquire:
        """The same as ``acquire``."""
        return self.acquire(
            timeout=timeout, blocking=blocking, tenant=tenant, weight=weight, cap=cap
        )

    async def try_acquire(
        self,
        *,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> Optional[Permit]:
        """A ``Permit`` if the lock is free and nobody waits, else None."""
        return _permit(await self._native.try_lock_async(tenant, weight, cap))

    async def try_lock(
        self,
        *,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> Optional[Permit]:
        """The same as ``try_acquire``."""
        return await self.try_acquire(tenant=tenant, weight=weight, cap=cap)

    async def locked(self) -> bool:
        """True when someone holds the lock now (one round trip)."""
        return await self._native.locked_async()

    async def release_id(self, id: str) -> None:
        """Release the lock held as permit ``id`` by any process."""
        await self._native.release_id_async(id)

    async def refresh_id(self, id: str, lease: float) -> None:
        """Extend the lease of permit ``id`` to ``lease`` seconds; never shortens it."""
        await self._native.refresh_id_async(id, lease)

    async def status(self) -> Dict[str, Any]:
        """The status JSON of the CLI, as a dict."""
        return await self._native.status_async()

    def __repr__(self) -> str:
        return repr(self._native).replace("redsem.", "redsem.aio.", 1)


class PermitSemaphore:
    """Counted permits without owners or leases (see ``redsem.PermitSemaphore``)."""

    __slots__ = ("_native",)

    def __init__(self, native: _redsem.PermitSemaphore) -> None:
        self._native = native

    @property
    def name(self) -> str:
        """The semaphore's name."""
        return self._native.name

    async def try_set_permits(self, permits: int) -> bool:
        """Set the count if it was never set; True if this call set it."""
        return await self._native.try_set_permits_async(permits)

    async def ensure_permits(self, permits: int) -> bool:
        """Set the count if it never was (or the server lost it); True if this call set it."""
        return await self._native.ensure_permits_async(permits)

    async def add_permits(self, delta: int) -> None:
        """Add ``delta`` permits (negative: take them away)."""
        await self._native.add_permits_async(delta)

    async def acquire(self, permits: int = 1, *, timeout: Optional[float] = None) -> None:
        """Wait in line (FIFO) for ``permits`` permits; ``redsem.Timeout`` when not in time."""
        await _wait(self._native.acquire_async(permits, timeout))

    async def try_acquire(self, permits: int = 1) -> bool:
        """Take ``permits`` permits if available and nobody waits: True, else False."""
        return await self._native.try_acquire_async(permits)

    async def release(self, permits: int = 1) -> None:
        """Give back ``permits`` permits."""
        await self._native.release_async(permits)

    async def available_permits(self) -> int:
        """The permits available now (may be negative)."""
        return await self._native.available_permits_async()

    async def drain_permits(self) -> int:
        """Take every available permit; returns how many."""
        return await self._native.drain_permits_async()

    async def delete(self) -> bool:
        """Delete the count and the queue; True if there was something to delete."""
        return await self._native.delete_async()

    def __repr__(self) -> str:
        return repr(self._native).replace("redsem.", "redsem.aio.", 1)


class CountDownLatch:
    """A countdown latch (see ``redsem.CountDownLatch``)."""

    __slots__ = ("_native",)

    def __init__(self, native: _redsem.CountDownLatch) -> None:
        self._native = native

    @property
    def name(self) -> str:
        """The latch's name."""
        return self._native.name

    async def try_set_count(self, count: int) -> bool:
        """Set the count unless counting already; True if this call set it."""
        return await self._native.try_set_count_async(count)

    async def count_down(self) -> Optional[int]:
        """Count down by one; at zero every waiter is opened. The count-downs left (0: this
        one opened it), or None if the latch was not counting."""
        return await self._native.count_down_async()

    async def count(self) -> int:
        """The count-downs still to go (0 when not counting)."""
        return await self._native.count_async()

    async def state(self) -> Dict[str, Any]:
        """``{"state": "counting" | "open" | "never-set", "count": n}``."""
        return await self._native.state_async()

    async def wait(self, *, timeout: Optional[float] = None) -> None:
        """Return when the count reaches zero; ``redsem.Timeout`` when not in time."""
        await _wait(self._native.wait_async(timeout))

    async def delete(self) -> bool:
        """Delete the latch (opening its waiters); True if it existed."""
        return await self._native.delete_async()

    def __repr__(self) -> str:
        return repr(self._native).replace("redsem.", "redsem.aio.", 1)


class Redsem:
    """A connection to one Redis deployment, from ``await redsem.aio.connect(url)``."""

    __slots__ = ("_native",)

    def __init__(self, native: _redsem.Redsem) -> None:
        self._native = native

    @property
    def prefix(self) -> str:
        """The key prefix."""
        return self._native.prefix

    @property
    def engine(self) -> str:
        """The engine that serves the calls: ``"native"`` (redsem's Redis module) or
        ``"scripts"`` (the Lua library)."""
        return self._native.engine

    def lease_semaphore(
        self,
        name: str,
        capacity: int,
        *,
        lease: float = 30.0,
        waiter_lease: float = 10.0,
        label: Optional[str] = None,
        one_per_label: bool = False,
        keepalive: bool = True,
    ) -> LeaseSemaphore:
        """A fair lease semaphore of ``capacity`` units (no round trip)."""
        return LeaseSemaphore(
            self._native.lease_semaphore(
                name,
                capacity,
                lease=lease,
                waiter_lease=waiter_lease,
                label=label,
                one_per_label=one_per_label,
                keepalive=keepalive,
            )
        )

    def mutex(
        self,
        name: str,
        *,
        lease: float = 30.0,
        waiter_lease: float = 10.0,
        label: Optional[str] = None,
        one_per_label: bool = False,
        keepalive: bool = True,
    ) -> Mutex:
        """A distributed mutex (no round trip)."""
        return Mutex(
            self._native.mutex(
                name,
                lease=lease,
                waiter_lease=waiter_lease,
                label=label,
                one_per_label=one_per_label,
                keepalive=keepalive,
            )
        )

    def permit_semaphore(
        self, name: str, *, waiter_lease: float = 10.0, permits: Optional[int] = None
    ) -> PermitSemaphore:
        """Counted permits (no round trip)."""
        return PermitSemaphore(
            self._native.permit_semaphore(name, waiter_lease=waiter_lease, permits=permits)
        )

    def count_down_latch(self, name: str, *, recheck: float = 1.0) -> CountDownLatch:
        """A countdown latch (no round trip)."""
        return CountDownLatch(self._native.count_down_latch(name, recheck=recheck))

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait until the releases and withdrawals sent in the background are done."""
        await self._native.flush_async(timeout)

    async def lease_semaphore_names(self) -> List[str]:
        """The names of the lease semaphores with state under this prefix."""
        return await self._native.lease_semaphore_names_async()

    def __repr__(self) -> str:
        return repr(self._native).replace("redsem.", "redsem.aio.", 1)


async def connect(
    url: str,
    *,
    prefix: Optional[str] = None,
    connect_timeout: float = 2.0,
    response_timeout: float = 5.0,
    server_checks: str = "enforce",
    group_commit: bool = True,
    tls_root_cert: Optional[str] = None,
    engine: str = "auto",
) -> Redsem:
    """Connect to the Redis at ``url`` (the URL forms and options of ``redsem.connect``)."""
    native = await _redsem.connect_async(
        url,
        prefix=prefix,
        connect_timeout=connect_timeout,
        response_timeout=response_timeout,
        server_checks=server_checks,
        group_commit=group_commit,
        tls_root_cert=tls_root_cert,
        engine=engine,
    )
    return Redsem(native)
