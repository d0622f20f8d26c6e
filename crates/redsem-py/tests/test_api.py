"""The Python surface: reprs, the mutex's acquire-style names, the non-blocking `with`,
`owned()`, `timeout=inf`, refused arguments with messages for a Python reader, the stub
against the module, and mypy on a small example."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import pathlib
import subprocess
import sys

import pytest

import redsem
import redsem.aio
from redsem import _redsem


def test_every_aio_class_has_a_repr_naming_it(url):
    async def main():
        r = await redsem.aio.connect(url)
        sem = r.lease_semaphore("s", 2)
        p = await sem.acquire(timeout=5.0)
        reprs = [
            repr(r),
            repr(sem),
            repr(r.mutex("m")),
            repr(r.permit_semaphore("ps")),
            repr(r.count_down_latch("cdl")),
            repr(p),
        ]
        await p.release()
        return reprs

    got = asyncio.run(asyncio.wait_for(main(), 20))
    assert got[0] == '<redsem.aio.Redsem prefix="redsem">'
    assert got[1] == '<redsem.aio.LeaseSemaphore name="s" capacity=2>'
    assert got[2] == '<redsem.aio.Mutex name="m">'
    assert got[3] == '<redsem.aio.PermitSemaphore name="ps">'
    assert got[4] == '<redsem.aio.CountDownLatch name="cdl">'
    assert got[5].startswith('<redsem.aio.Permit semaphore="s" ')


def test_the_mutex_speaks_acquire_and_the_non_blocking_with_raises_no_permit(url):
    r = redsem.connect(url)
    m = r.mutex("ledger", label="me")
    assert not m.locked()
    with m.acquire(timeout=5.0) as p:
        assert m.locked() and p.owned() and p.is_held()
        assert m.try_acquire() is None and m.try_lock() is None
        with pytest.raises(redsem.NoPermit):
            with m.acquire(blocking=False):
                pytest.fail("entered a busy lock")
        m.refresh_id(p.id, 60.0)
        with pytest.raises(redsem.InvalidArgument, match="shorten"):
            m.refresh_id(p.id, 1.0)
    assert not p.owned() and not m.locked()
    q = m.acquire(blocking=False)
    m.release_id(q.id)
    with pytest.raises(redsem.NotHeld):
        m.release_id(q.id)
    with pytest.raises(ValueError):
        m.release_id("")
    single = r.mutex("single", label="worker-1", one_per_label=True)
    held = single.acquire(timeout=5.0)
    with pytest.raises(redsem.AlreadyHeld):
        r.mutex("single", label="worker-1", one_per_label=True).try_acquire()
    held.release()


def test_aio_mutex_acquire_and_blocking_false(url):
    async def main():
        r = await redsem.aio.connect(url)
        m = r.mutex("am")
        async with m.acquire(timeout=5.0) as p:
            assert p.owned() and await m.locked()
            with pytest.raises(redsem.NoPermit):
                async with m.acquire(blocking=False):
                    pytest.fail("entered a busy lock")
            assert await m.try_acquire() is None
        assert not await m.locked()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_timeout_inf_waits_without_limit_and_the_other_refusals_say_why(url):
    r = redsem.connect(url)
    sem = r.lease_semaphore("inf", 1)
    sem.acquire(timeout=float("inf")).release()
    with pytest.raises(ValueError, match=r"capacity must be an integer from 1 to 4294967295"):
        r.lease_semaphore("big", 2**40)
    with pytest.raises(ValueError, match=r"lease must be at least 0.030 s"):
        r.lease_semaphore("short", 1, lease=0.0)
    with pytest.raises(ValueError, match="empty"):
        sem.release_id("")
    with pytest.raises(ValueError, match=r"redis://, rediss://"):
        redsem.connect("127.0.0.1:6379")
    held = sem.acquire(timeout=5.0)
    with pytest.raises(redsem.Timeout) as timed_out:
        sem.acquire(timeout=0.1)
    assert timed_out.match(r"timed out after \d+ ms waiting for \"inf\"")
    held.release()


def test_unavailable_names_its_cause_once():
    with pytest.raises(redsem.Unavailable) as err:
        redsem.connect("redis://127.0.0.1:1", connect_timeout=0.5)
    text = str(err.value)
    assert text.count("refused") <= 1, text


def test_the_stub_names_what_the_native_module_has():
    stub = pathlib.Path(_redsem.__file__).with_name("_redsem.pyi")
    if not stub.exists():  # an installed package: the stub beside the package's __init__
        stub = pathlib.Path(redsem.__file__).with_name("_redsem.pyi")
    tree = ast.parse(stub.read_text())
    stubbed = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            stubbed[node.name] = None
        elif isinstance(node, ast.ClassDef):
            stubbed[node.name] = {
                n.name for n in node.body if isinstance(n, ast.FunctionDef)
            }
    runtime = {n for n in dir(_redsem) if not n.startswith("__") and n != "VERSION"}
    assert set(stubbed) == runtime
    for name, methods in stubbed.items():
        if methods is None:
            continue
        actual = {m for m in vars(getattr(_redsem, name)) if not m.startswith("__")}
        actual |= {m for m in ("__enter__", "__exit__") if hasattr(getattr(_redsem, name), m)}
        declared = {m for m in methods if not m.startswith("__") or m in ("__enter__", "__exit__")}
        assert declared == actual, name


EXAMPLE = '''
import redsem
import redsem.aio


def token(url: str) -> int:
    sem = redsem.connect(url).lease_semaphore("x", 1)
    with sem.acquire(timeout=1.0) as p:
        return p.token


async def atoken(url: str) -> int:
    r = await redsem.aio.connect(url)
    async with r.mutex("m").acquire(blocking=False) as p:
        return p.token
'''


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_mypy_strict_accepts_a_with_block_that_returns(tmp_path):
    example = tmp_path / "example.py"
    example.write_text(EXAMPLE)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(example)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
