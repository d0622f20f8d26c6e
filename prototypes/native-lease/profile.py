#!/usr/bin/env python3
"""Where the native cycle's instructions go: a callgrind profile of the module's cycles alone.

Starts redis-server under callgrind with collection off and the module loaded, primes a
semaphore with one FCALL cycle, turns collection on for `cycles` native cycles (pipelined as in
server_instructions.py) and off again, dumps, and prints callgrind_annotate's inclusive costs
per cycle (the functions above --threshold percent of the total). Keeps the dump in the printed
directory for a closer look.

Usage: python3 profile.py PATH/TO/libnative_lease.so [cycles] [--rows N] [--module-args "ARG ..."]
"""
import os
import subprocess
import sys
import tempfile
import time
import uuid

import redis

ARGS = sys.argv[1:]
MODULE = os.path.abspath(ARGS[0])
CYCLES = int(ARGS[1]) if len(ARGS) > 1 and not ARGS[1].startswith("--") else 300
MODULE_ARGS = ARGS[ARGS.index("--module-args") + 1].split() if "--module-args" in ARGS else []
ROWS = int(ARGS[ARGS.index("--rows") + 1]) if "--rows" in ARGS else 45
sys.argv = sys.argv[:1]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "redsem-bench", "scripts"))
import server_instructions as si  # noqa: E402


def main():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    d = tempfile.mkdtemp(prefix="native-lease-prof-")
    out = f"{d}/out"
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
         "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", d, "--loadmodule", MODULE, *MODULE_ARGS], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port, decode_responses=True)
    try:
        for _ in range(600):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        r.function_load(si.library(), replace=True)
        k, h = si.lease_keys("n"), si.h
        r.execute_command("FCALL", "rx_lease_acquire", 4, *k, "p", 8, 1, 30000, "", "0", "try", 3000, "c", h(1), "sess", h(1))
        r.execute_command("FCALL", "rx_lease_release", 4, *k, "p", "c", h(2), "sess", h(2), "r")
        pipe = r.pipeline(transaction=False)
        for i in range(CYCLES):
            pid, a, rel = uuid.uuid4().hex, 2 * i + 3, 2 * i + 4
            pipe.execute_command("RXN.LEASE_ACQUIRE", 4, *k, pid, 8, 1, 30000, "", "0", "try", 3000, "c", h(a), "sess", h(a))
            pipe.execute_command("RXN.LEASE_RELEASE", 4, *k, pid, "c", h(rel), "sess", h(rel), "r")
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, stdout=subprocess.DEVNULL)
        pipe.execute(raise_on_error=True)
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, stdout=subprocess.DEVNULL)
    finally:
        proc.terminate()  # (callgrind writes its dump at exit)
        proc.wait()
    total = None
    for line in open(out):
        if line.startswith(("summary:", "totals:")):
            total = int(line.split()[1])
    print(f"{total / CYCLES / 1000:.1f} k instructions per native cycle ({CYCLES} cycles), dump in {d}")
    annotate = subprocess.run(["callgrind_annotate", "--inclusive=yes", f"--threshold=99", out],
                              capture_output=True, text=True, check=True).stdout
    rows = 0
    for line in annotate.splitlines():
        parts = line.split()
        if parts and parts[0].replace(",", "").isdigit() and "(" in line and rows < ROWS:
            ir = int(parts[0].replace(",", ""))
            name = line.split("*", 1)[-1].split(" [")[0].strip() if "*" in line else " ".join(parts[2:])
            print(f"{ir / CYCLES / 1000:8.2f} k  {name}")
            rows += 1


if __name__ == "__main__":
    main()
