"""What a cycle costs through Python: one uncontended try_acquire + release of a lease permit,
timed N times through the blocking API and through redsem.aio, against one throwaway
redis-server (started and stopped here), beside the same cycle from Rust in the same run.

    python bench/cycle.py [--n 2000] [--rust PATH-TO-examples/cycle]

The Rust figure comes from `cargo run --release --example cycle` (built by the caller, see
the README); without --rust only the Python figures are printed. Prints one JSON line per
API: median and p99 per cycle in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import redsem
import redsem.aio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summary(api: str, micros: list) -> dict:
    micros = sorted(micros)
    at = lambda q: micros[round((len(micros) - 1) * q)]  # noqa: E731
    return {"api": api, "n": len(micros), "median_us": round(at(0.5), 1), "p99_us": round(at(0.99), 1)}


def sync_cycles(url: str, n: int) -> dict:
    sem = redsem.connect(url).lease_semaphore("bench-cycle-sync", 1)
    for _ in range(n // 10):
        sem.try_acquire().release()
    micros = []
    for _ in range(n):
        start = time.perf_counter()
        sem.try_acquire().release()
        micros.append((time.perf_counter() - start) * 1e6)
    return summary("python-sync", micros)


async def aio_cycles(url: str, n: int) -> dict:
    r = await redsem.aio.connect(url)
    sem = r.lease_semaphore("bench-cycle-aio", 1)
    for _ in range(n // 10):
        await (await sem.try_acquire()).release()
    micros = []
    for _ in range(n):
        start = time.perf_counter()
        await (await sem.try_acquire()).release()
        micros.append((time.perf_counter() - start) * 1e6)
    return summary("python-asyncio", micros)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rust", help="the built Rust example `cycle`")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="redsem-bench-")
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        results = []
        if args.rust:
            out = subprocess.run([args.rust, url, str(args.n)], capture_output=True, text=True,
                                 timeout=300, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        results.append(sync_cycles(url, args.n))
        results.append(asyncio.run(aio_cycles(url, args.n)))
        for result in results:
            print(json.dumps(result))
    finally:
        server.kill()
        server.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
