"""Fixtures: a throwaway redis-server per test, a raw Redis command for set-ups the library
cannot make (foreign values, other layouts), and a deadline on every test so that a hang
fails instead of stalling the run."""

from __future__ import annotations

import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Iterator, List, Optional, Union

import pytest

# The most one test may take, waits included (each wait has a timeout of its own as well).
TEST_DEADLINE = 60

# Ctrl-C as an interactive interpreter has it, however the tests were started: a runner that
# starts them as a background job of a non-interactive shell hands on SIGINT ignored, and
# Python then installs no KeyboardInterrupt handler, here nor in the interpreters the tests
# start (an ignored signal stays ignored across exec; a handled one is reset to the default).
signal.signal(signal.SIGINT, signal.default_int_handler)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(port: int, *args: Union[str, int]) -> object:
    """Send one command to the Redis at `port` and read its reply (RESP2, the few reply
    types the tests need)."""
    parts = [str(a).encode() for a in args]
    payload = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(payload)
        reader = conn.makefile("rb")
        return _reply(reader)


def _reply(reader) -> object:
    line = reader.readline().rstrip(b"\r\n")
    kind, rest = line[:1], line[1:]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = reader.read(n + 2)[:-2]
        return data.decode()
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_reply(reader) for _ in range(n)]
    raise RuntimeError(f"unexpected reply {line!r}")


class RedisServer:
    """A redis-server of its own on a free port, in a temporary directory, no persistence."""

    def __init__(self) -> None:
        if shutil.which("redis-server") is None:
            pytest.fail("redis-server is not on PATH (the tests start their own)")
        self.dir = tempfile.mkdtemp(prefix="redsem-py-test-")
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                if command(self.port, "PING") == "PONG":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                pytest.fail(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def command(self, *args: Union[str, int]) -> object:
        return command(self.port, *args)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    srv = RedisServer()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def url(server: RedisServer) -> str:
    return server.url


class DeadlineExceeded(Exception):
    pass


@pytest.fixture(autouse=True)
def deadline() -> Iterator[None]:
    """Fail a test that runs past TEST_DEADLINE: SIGALRM raises in the main thread, and the
    library's blocking waits heed signals (that is one of the things tested)."""

    def expired(signum, frame):  # noqa: ARG001
        raise DeadlineExceeded(f"test ran past {TEST_DEADLINE} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TEST_DEADLINE)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def wait_until(predicate, timeout: float = 5.0, what: str = "condition") -> None:
    """Poll `predicate` every 10 ms until true; fail after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"{what} not reached within {timeout} s")
        time.sleep(0.01)


class Child:
    """`code` run by a fresh interpreter (the one running the tests); its output lines are
    read by a thread, so that each can be waited for with a timeout."""

    def __init__(self, code: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-c", code, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.stderr: List[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_errors, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def _read_errors(self) -> None:
        for line in self.process.stderr:
            self.stderr.append(line)

    def line(self, timeout: float = 10.0) -> str:
        """The next line the child prints, within `timeout` seconds."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            pytest.fail(f"the child printed nothing within {timeout} s; stderr: {''.join(self.stderr)}")
        if line is None:
            self.process.wait(timeout=10)
            pytest.fail(
                f"the child ended (exit {self.process.returncode}); stderr: {''.join(self.stderr)}"
            )
        return line

    def wait(self, timeout: float = 10.0) -> int:
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def waiter_ids(sem) -> List[str]:
    return [w["id"] for w in sem.status()["waiters"]]


def assert_tokens_follow_grant_order(spans) -> None:
    """`spans`: (acquire called, release returned, token) of each permit. A permit released
    before another was asked for was granted before it, so its token is smaller; tokens are
    never reused."""
    assert len({token for _, _, token in spans}) == len(spans)
    for _, released, token_a in spans:
        for asked, _, token_b in spans:
            if released < asked:
                assert token_a < token_b
