#!/usr/bin/env python3
"""Instructions the *client* executes per cycle (user space only), counted by callgrind.

server_instructions.py counts what Redis does; this counts the other side: redsem's library
(arguments, replies, sessions, the keepalive, spans) and redis-rs beneath it, against the
polling baseline's cycle on a plain redis-rs connection. The client example
(crates/redsem-bench/examples/client_cycle.rs) runs under valgrind twice, for N and 3N cycles,
and the difference over 2N cycles is the cost of one cycle: start-up, connecting and loading
scripts cancel out. Kernel time (the socket calls) is not counted by callgrind.

Rows:
  lease       redsem try_acquire + release, one client, capacity 5
  polling     the polling baseline's EVALSHA attempt + ZREM (as redsem-bench's S9)
  contended   64 tasks of one client, capacity 8, acquire + yield + release (S2's loop)
  floor       the lease cycle's two module commands (same keys, arguments and replies) sent by
              bare redis-rs, no library: what the protocol's messages cost a client by
              themselves (with --module only)

Usage:
  cargo build --release -p redsem-bench --example client_cycle
  python3 crates/redsem-bench/scripts/client_instructions.py [cycles] [--module PATH]
(--module: the throwaway server loads the native engine, so redsem's calls go as
REDSEM.<OP>; without it they go by FCALL. Default cycles: 1000, a multiple of 64.)
Needs valgrind, redis-server and the `redis` Python package (server_instructions.py,
whose free_port() this uses, imports it).
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_instructions as si  # noqa: E402  (its free_port())

BINARY = os.path.join(ROOT, "target", "release", "examples", "client_cycle")


def start_server(module):
    port = si.free_port()
    workdir = tempfile.mkdtemp(prefix="redsem-client-ir-")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir]
        + (["--loadmodule", module] if module else []),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, port, workdir
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def count(port, kind, cycles, workdir):
    out = os.path.join(workdir, f"{kind}-{cycles}.callgrind")
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", BINARY,
         f"redis://127.0.0.1:{port}", kind, str(cycles)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800)
    if run.returncode != 0:
        raise SystemExit(f"client_cycle {kind} {cycles} failed:\n{run.stdout}{run.stderr[-2000:]}")
    for line in open(out):
        m = re.match(r"(summary|totals): (\d+)", line)
        if m:
            return int(m.group(2))
    raise SystemExit(f"no instruction total in {out}")


def main():
    args = sys.argv[1:]
    module = None
    if "--module" in args:
        i = args.index("--module")
        module = os.path.abspath(args[i + 1])
        del args[i:i + 2]
    cycles = int(args[0]) if args else 1000
    cycles -= cycles % 64
    if cycles <= 0:
        raise SystemExit("cycles: at least 64")
    if not os.path.exists(BINARY):
        raise SystemExit(f"{BINARY} is missing: cargo build --release -p redsem-bench --example client_cycle")
    proc, port, workdir = start_server(module)
    try:
        engine = "native engine" if module else "scripts (FCALL)"
        print(f"client instructions per cycle, redsem on the {engine}; {cycles} and {3 * cycles} cycles")
        for kind in ("lease", "polling", "contended") + (("floor",) if module else ()):
            few = count(port, kind, cycles, workdir)
            many = count(port, kind, 3 * cycles, workdir)
            print(f"{kind:<10} {(many - few) / (2 * cycles) / 1000:8.1f} k instructions per cycle")
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
