"""Type stubs of the native module (the Rust half of redsem).

The blocking classes below are the ones ``import redsem`` exports; the ``*_async`` methods
are what ``redsem.aio`` wraps. ``tests/test_stubs.py`` checks this file against the built
module with ``mypy.stubtest``. The classes are final: the native types cannot be subclassed.
"""

from __future__ import annotations

from os import PathLike
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    List,
    Literal,
    Optional,
    Tuple,
    Type,
    Union,
    final,
)
from types import TracebackType

__all__ = [
    "connect",
    "connect_async",
    "_shutdown",
    "_after_fork",
    "Redsem",
    "LeaseSemaphore",
    "Mutex",
    "Permit",
    "Settle",
    "PermitSemaphore",
    "CountDownLatch",
    "VERSION",
]

VERSION: str

_ServerChecks = Literal["enforce", "warn", "off"]
_Engine = Literal["auto", "scripts", "native"]
_Status = Dict[str, Any]

def connect(
    url: str,
    *,
    prefix: Optional[str] = None,
    connect_timeout: float = 2.0,
    response_timeout: float = 5.0,
    server_checks: _ServerChecks = "enforce",
    group_commit: bool = True,
    tls_root_cert: Optional[Union[str, PathLike[str]]] = None,
    engine: _Engine = "auto",
) -> Redsem:
    """Connect to the Redis at ``url``: ``redis://[user:password@]host[:port][/db]``,
    ``rediss://`` (TLS), ``redis+unix://``, ``redis+cluster://host:port,host:port`` or
    ``redis+sentinel://host:port,host:port/master[/db]``. Keys start with ``prefix``
    (default ``"redsem"``). ``engine``: ``"auto"`` uses redsem's Redis module where the
    server has it, ``"scripts"`` never, ``"native"`` only (else ``EngineUnavailable``)."""

def connect_async(
    url: str,
    *,
    prefix: Optional[str] = None,
    connect_timeout: float = 2.0,
    response_timeout: float = 5.0,
    server_checks: _ServerChecks = "enforce",
    group_commit: bool = True,
    tls_root_cert: Optional[Union[str, PathLike[str]]] = None,
    engine: _Engine = "auto",
) -> Awaitable[Redsem]: ...

def _shutdown() -> None:
    """The interpreter's exit (``atexit``): release the permits still held, then stop calling
    into Python from the runtime's threads."""

def _after_fork() -> None:
    """In a forked child (``os.register_at_fork``): fresh random ids."""

@final
class Settle:
    """What a cancelled asyncio wait leaves to finish (used by ``redsem.aio``)."""

    def wait(self) -> Awaitable[None]: ...

@final
class Redsem:
    """A connection to one Redis deployment: one command and one pub/sub connection,
    shared by every primitive and permit made from it, and by every thread."""

    @property
    def prefix(self) -> str: ...
    @property
    def engine(self) -> Literal["native", "scripts"]:
        """The engine that serves the calls: redsem's Redis module or the Lua scripts."""
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
        """A fair lease semaphore of ``capacity`` units; no round trip."""
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
        """A distributed mutex (a lease semaphore of capacity 1); no round trip."""
    def permit_semaphore(
        self, name: str, *, waiter_lease: float = 10.0, permits: Optional[int] = None
    ) -> PermitSemaphore:
        """Counted permits without owners or leases; no round trip."""
    def count_down_latch(self, name: str, *, recheck: float = 1.0) -> CountDownLatch:
        """A countdown latch; no round trip."""
    def flush(self, timeout: float = 5.0) -> None:
        """Wait until releases and withdrawals sent in the background are done."""
    def flush_async(self, timeout: float = 5.0) -> Awaitable[None]: ...
    def lease_semaphore_names(self) -> List[str]:
        """The lease semaphores with state under this prefix."""
    def lease_semaphore_names_async(self) -> Awaitable[List[str]]: ...

@final
class Permit:
    """A permit of a lease semaphore, renewed in the background while it lives; a context
    manager that releases it."""

    @property
    def id(self) -> str: ...
    @property
    def token(self) -> int: ...
    @property
    def slots(self) -> List[int]: ...
    @property
    def slot(self) -> int: ...
    @property
    def semaphore(self) -> str: ...
    def is_held(self) -> bool: ...
    def owned(self) -> bool:
        """redis-py's name for ``is_held()``."""
    def is_lost(self) -> bool: ...
    def time_left(self) -> float: ...
    def release(self) -> None:
        """Release; raises ``NotHeld`` if it was not held any more."""
    def release_async(self) -> Awaitable[None]: ...
    def refresh(self) -> None:
        """Renew the lease now; raises ``LeaseLost`` if it was lost."""
    def refresh_async(self) -> Awaitable[None]: ...
    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Block until lost (True) or released or ``timeout`` passed (False)."""
    def lost_async(self) -> Awaitable[bool]: ...
    def on_lost(self, callback: Callable[[], Any]) -> None:
        """Call ``callback()`` once if the lease is lost (from a background thread)."""
    def __enter__(self) -> Permit: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]] = None,
        _exc: Optional[BaseException] = None,
        _tb: Optional[TracebackType] = None,
    ) -> None: ...
    def exit_async(self, raising: bool) -> Awaitable[None]: ...

@final
class LeaseSemaphore:
    """A fair counting semaphore whose permits are leases."""

    @property
    def name(self) -> str: ...
    @property
    def capacity(self) -> int: ...
    def acquire(
        self,
        units: int = 1,
        *,
        timeout: Optional[float] = None,
        blocking: bool = True,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> Permit:
        """Wait in line (FIFO; with ``tenant``, in fair shares between tenants);
        ``redsem.Timeout`` when ``timeout`` seconds run out; ``blocking=False``:
        ``redsem.NoPermit`` when busy."""
    def acquire_async(
        self,
        units: int = 1,
        timeout: Optional[float] = None,
        blocking: bool = True,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> Tuple[Awaitable[Permit], Settle]: ...
    def try_acquire(
        self,
        units: int = 1,
        *,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> Optional[Permit]:
        """A ``Permit`` if free and nobody waits, else None."""
    def try_acquire_async(
        self,
        units: int = 1,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> Awaitable[Optional[Permit]]: ...
    def status(self) -> _Status:
        """The status JSON of the CLI (``redsem status NAME --json``) as a dict."""
    def status_async(self) -> Awaitable[_Status]: ...
    def set_capacity(self, capacity: int) -> Optional[int]: ...
    def set_capacity_async(self, capacity: int) -> Awaitable[Optional[int]]: ...
    def locked(self) -> bool: ...
    def locked_async(self) -> Awaitable[bool]: ...
    def release_id(self, id: str) -> None: ...
    def release_id_async(self, id: str) -> Awaitable[None]: ...
    def refresh_id(self, id: str, lease: float) -> None: ...
    def refresh_id_async(self, id: str, lease: float) -> Awaitable[None]: ...

@final
class Mutex:
    """A distributed mutex: a fair lease semaphore of capacity 1."""

    @property
    def name(self) -> str: ...
    def acquire(
        self,
        *,
        timeout: Optional[float] = None,
        blocking: bool = True,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> Permit:
        """Wait in line for the lock; ``blocking=False``: ``redsem.NoPermit`` when busy."""
    def lock(
        self,
        *,
        timeout: Optional[float] = None,
        blocking: bool = True,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> Permit: ...
    def lock_async(
        self,
        timeout: Optional[float] = None,
        blocking: bool = True,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        cap: Optional[int] = None,
    ) -> Tuple[Awaitable[Permit], Settle]: ...
    def try_acquire(
        self, *, tenant: Optional[str] = None, weight: Optional[int] = None, cap: Optional[int] = None
    ) -> Optional[Permit]: ...
    def try_lock(
        self, *, tenant: Optional[str] = None, weight: Optional[int] = None, cap: Optional[int] = None
    ) -> Optional[Permit]: ...
    def try_lock_async(
        self, tenant: Optional[str] = None, weight: Optional[int] = None, cap: Optional[int] = None
    ) -> Awaitable[Optional[Permit]]: ...
    def status(self) -> _Status: ...
    def status_async(self) -> Awaitable[_Status]: ...
    def locked(self) -> bool: ...
    def locked_async(self) -> Awaitable[bool]: ...
    def release_id(self, id: str) -> None: ...
    def release_id_async(self, id: str) -> Awaitable[None]: ...
    def refresh_id(self, id: str, lease: float) -> None: ...
    def refresh_id_async(self, id: str, lease: float) -> Awaitable[None]: ...

@final
class PermitSemaphore:
    """Counted permits without owners or leases, with FIFO waiting."""

    @property
    def name(self) -> str: ...
    def try_set_permits(self, permits: int) -> bool: ...
    def try_set_permits_async(self, permits: int) -> Awaitable[bool]: ...
    def ensure_permits(self, permits: int) -> bool: ...
    def ensure_permits_async(self, permits: int) -> Awaitable[bool]: ...
    def add_permits(self, delta: int) -> None: ...
    def add_permits_async(self, delta: int) -> Awaitable[None]: ...
    def available_permits(self) -> int: ...
    def available_permits_async(self) -> Awaitable[int]: ...
    def drain_permits(self) -> int: ...
    def drain_permits_async(self) -> Awaitable[int]: ...
    def delete(self) -> bool: ...
    def delete_async(self) -> Awaitable[bool]: ...
    def release(self, permits: int = 1) -> None: ...
    def release_async(self, permits: int = 1) -> Awaitable[None]: ...
    def acquire(self, permits: int = 1, *, timeout: Optional[float] = None) -> None:
        """Wait in line (FIFO); ``redsem.Timeout`` when ``timeout`` seconds run out."""
    def acquire_async(
        self, permits: int = 1, timeout: Optional[float] = None
    ) -> Tuple[Awaitable[None], Settle]: ...
    def try_acquire(self, permits: int = 1) -> bool: ...
    def try_acquire_async(self, permits: int = 1) -> Awaitable[bool]: ...

@final
class CountDownLatch:
    """A countdown latch: at zero, every waiter in every process returns."""

    @property
    def name(self) -> str: ...
    def try_set_count(self, count: int) -> bool: ...
    def try_set_count_async(self, count: int) -> Awaitable[bool]: ...
    def count_down(self) -> Optional[int]: ...
    def count_down_async(self) -> Awaitable[Optional[int]]: ...
    def count(self) -> int: ...
    def count_async(self) -> Awaitable[int]: ...
    def state(self) -> Dict[str, Any]:
        """``{"state": "counting" | "open" | "never-set", "count": n}``."""
    def state_async(self) -> Awaitable[Dict[str, Any]]: ...
    def wait(self, *, timeout: Optional[float] = None) -> None:
        """Block until zero; ``redsem.Timeout`` when ``timeout`` seconds run out."""
    def wait_async(self, timeout: Optional[float] = None) -> Tuple[Awaitable[None], Settle]: ...
    def delete(self) -> bool: ...
    def delete_async(self) -> Awaitable[bool]: ...
