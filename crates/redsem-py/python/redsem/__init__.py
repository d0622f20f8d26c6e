"""redsem: fair distributed semaphores with leases and fencing tokens on Redis.

The Python face of the redsem Rust library: the same primitives with the same guarantees,
run on the library's own runtime (background lease renewal, FIFO waiting queue, group
commit). Blocking calls release the GIL while they wait, and Ctrl-C interrupts them; the
same names, awaitable, are in :mod:`redsem.aio`.

>>> import redsem
>>> r = redsem.connect("redis://127.0.0.1:6379")
>>> sem = r.lease_semaphore("exports", 2, lease=30.0)
>>> with sem.acquire(timeout=5.0) as permit:
...     print(permit.token, permit.slots)
"""

from __future__ import annotations

from . import _errors
from ._errors import *  # noqa: F403 (every exception, listed in _errors.__all__)
from ._redsem import (
    VERSION as __version__,
    CountDownLatch,
    LeaseSemaphore,
    Mutex,
    Permit,
    PermitSemaphore,
    Redsem,
    connect,
)

__all__ = [
    "connect",
    "Redsem",
    "LeaseSemaphore",
    "Mutex",
    "Permit",
    "PermitSemaphore",
    "CountDownLatch",
    "__version__",
] + _errors.__all__
