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

import atexit as _atexit
import os as _os

from . import _errors
from ._errors import *  # noqa: F403 (every exception, listed in _errors.__all__)
from ._redsem import (
    VERSION as __version__,
    CountDownLatch as CountDownLatch,
    LeaseSemaphore as LeaseSemaphore,
    Mutex as Mutex,
    Permit as Permit,
    PermitSemaphore as PermitSemaphore,
    Redsem as Redsem,
    connect as connect,
)
from ._redsem import _after_fork, _shutdown

# At exit, before the interpreter is torn down: release the permits still held (at most 2 s)
# and stop the runtime's threads from calling into Python (one that did during the tear-down
# crashed the interpreter).
_atexit.register(_shutdown)
# In a forked child: fresh random ids (the child's runtime and the refusal of the parent's
# objects need no hook: they go by the process id).
if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_after_fork)

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
