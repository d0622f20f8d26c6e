"""The exceptions of redsem: one class for each variant of the Rust library's ``Error``.

Each carries the Rust error's message (with its cause, for the transport errors). Some are
also the built-in exception a Python reader would reach for: ``Timeout`` is a
``TimeoutError``, ``Unavailable`` a ``ConnectionError``, ``InvalidArgument`` a
``ValueError``.
"""

from __future__ import annotations

__all__ = [
    "Error",
    "Unavailable",
    "RedisError",
    "NoPermit",
    "NotEnoughPermits",
    "Timeout",
    "NotHeld",
    "LeaseLost",
    "CapacityConflict",
    "TenantConflict",
    "AlreadyHeld",
    "InvalidArgument",
    "WrongType",
    "StateLost",
    "Unsuitable",
    "EngineUnavailable",
    "NotReplicated",
    "ProtocolError",
    "Incompatible",
    "WrongProcess",
]


class Error(Exception):
    """Anything that went wrong in redsem: the base of every exception it raises."""


class Unavailable(Error, ConnectionError):
    """Redis could not be reached: connection refused or dropped, or a command timed out."""


class RedisError(Error):
    """Redis answered with an error redsem does not expect (a bad password, out of memory...)."""


class NoPermit(Error):
    """No unit was free, or others wait first (``try_acquire`` returns None for this)."""


class NotEnoughPermits(Error):
    """Fewer permits than asked for were available (``try_acquire`` returns False for this)."""


class Timeout(Error, TimeoutError):
    """A wait with ``timeout=`` ran out; the request has left the queue."""


class NotHeld(Error):
    """A release or renewal of a permit that is not held (released already, or its lease ended)."""


class LeaseLost(NotHeld):
    """A permit's lease was lost while it was in use (it was not renewed in time)."""


class CapacityConflict(Error):
    """The semaphore is in use with another capacity than the one this handle asks for."""


class TenantConflict(Error):
    """A tenant holds or waits with another weight or cap than the ones this request names:
    give every request of a tenant the same ``weight=`` and ``cap=``."""


class AlreadyHeld(Error):
    """With ``one_per_label``, the label already holds or waits for a permit."""


class InvalidArgument(Error, ValueError):
    """An argument was refused before anything was sent to Redis."""


class WrongType(Error):
    """A key where redsem keeps its state holds a foreign value; it was left untouched."""


class StateLost(Error):
    """The primitive's state vanished from Redis while a call relied on it (restart, flush)."""


class Unsuitable(Error):
    """The server is set up so that redsem's guarantees would not hold (eviction, ACL)."""


class EngineUnavailable(Error):
    """``engine="native"`` was asked for and a server cannot serve it: it has no redsem module
    (or the user may not run its commands)."""


class NotReplicated(Error):
    """With replica acknowledgements, fewer replicas than asked for acknowledged a change."""


class ProtocolError(Error):
    """A script answered in a shape redsem does not understand."""


class Incompatible(Error):
    """The state in Redis was written by a redsem of another layout; it was left untouched."""


class WrongProcess(Error, RuntimeError):
    """An object made in another process (before an ``os.fork()``) was used in a forked
    child: connect again in the child."""
