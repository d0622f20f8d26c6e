"""The typed surface held to the built module: the stubs checked by ``mypy.stubtest``, and
each blocking class of ``redsem`` against its asyncio twin in ``redsem.aio`` (the same
public methods, with the same parameters), so that neither can drift from the other."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from typing import Dict, List, Set, Tuple

import pytest

import redsem
import redsem.aio

# The classes both modules export.
TWINS = ["Redsem", "LeaseSemaphore", "Mutex", "Permit", "PermitSemaphore", "CountDownLatch"]

# Methods with no twin of the same name, by class, and why.
SYNC_ONLY: Dict[str, Set[str]] = {
    # A blocking wait takes a timeout; asyncio's `lost()` is bounded by `asyncio.wait_for`.
    "Permit": {"wait_lost"},
}
AIO_ONLY: Dict[str, Set[str]] = {
    "Permit": {"lost"},
}


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_the_stubs_match_the_built_module():
    done = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "redsem._redsem"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def public(cls: type) -> Tuple[Dict[str, object], Set[str]]:
    """The public methods of ``cls`` (by name) and its public properties; the native
    classes' ``*_async`` methods are what ``redsem.aio`` wraps, not a part of the blocking
    API."""
    methods = {}
    properties = set()
    for name in dir(cls):
        if name.startswith("_") or name.endswith("_async"):
            continue
        attribute = inspect.getattr_static(cls, name)
        if isinstance(attribute, property) or inspect.isgetsetdescriptor(attribute):
            properties.add(name)
        elif callable(getattr(cls, name)):
            methods[name] = getattr(cls, name)
    return methods, properties


def parameters(method: object) -> List[Tuple[str, str, object]]:
    """The parameters after ``self``: name, kind and default (annotations aside: the native
    methods have none)."""
    signature = inspect.signature(method)  # type: ignore[arg-type]
    return [
        (p.name, p.kind.name, p.default)
        for p in list(signature.parameters.values())[1:]
    ]


@pytest.mark.parametrize("name", TWINS)
def test_every_method_has_an_async_twin_with_the_same_parameters(name):
    sync_methods, sync_properties = public(getattr(redsem, name))
    aio_methods, aio_properties = public(getattr(redsem.aio, name))
    assert sync_properties == aio_properties
    assert set(sync_methods) - SYNC_ONLY.get(name, set()) == set(aio_methods) - AIO_ONLY.get(
        name, set()
    )
    for method in set(sync_methods) & set(aio_methods):
        assert parameters(sync_methods[method]) == parameters(aio_methods[method]), (
            f"{name}.{method}"
        )


@pytest.mark.parametrize("name", TWINS)
def test_the_twins_that_wait_are_coroutines_or_awaitables(name):
    # A method that talks to Redis is `async def` in redsem.aio; the ones that read local
    # state (or only make an object) stay plain, as in the blocking class.
    aio = getattr(redsem.aio, name)
    methods, _ = public(aio)
    plain = {
        name: method
        for name, method in methods.items()
        if not inspect.iscoroutinefunction(method)
    }
    local = {
        "is_held",
        "owned",
        "is_lost",
        "time_left",
        "on_lost",
        "lease_semaphore",
        "mutex",
        "permit_semaphore",
        "count_down_latch",
        # Awaitable and an async context manager: `await sem.acquire()`,
        # `async with sem.acquire() as permit`.
        "acquire",
        "lock",
    }
    assert set(plain) <= local, f"{name}: {sorted(set(plain) - local)}"
