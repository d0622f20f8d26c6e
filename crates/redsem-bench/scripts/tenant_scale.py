#!/usr/bin/env python3
"""Server time per grant on one lease semaphore with many tenants and many waiters.

For each row, a fresh semaphore of capacity 16 is filled with 16 holders and WAITERS queued
requests spread round robin over T tenants (weight 1, no cap), then GRANTS releases are sent
one by one, each of which grants the turn's head (the release's reply carries the grant: every
waiter names the sender's wake channel); the next release releases the oldest holder, so the
queue shrinks by one per grant. Rows: `fifo` (no tenant named: the plain FIFO), then 1, 10,
1,000 and 10,000 tenants.

Reported per row: `INFO commandstats` usec per release (each grants one waiter; Redis times a
call by the wall clock, so on a shared machine this is noisy: read the rows against each other,
one run), and with `--callgrind` the instructions the server executes per release, counted
by callgrind (the fill runs with instrumentation off; a count depends on the binary and the
inputs, not on the load).

Usage: python3 crates/redsem-bench/scripts/tenant_scale.py [--waiters N] [--grants N]
       [--tenants 1,10,1000,10000] [--callgrind]
Needs redis-server (and valgrind for --callgrind) and the `redis` Python package.
"""
import argparse
import os
import subprocess
import sys
import time
import uuid

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_instructions as si  # noqa: E402  (its library() and helpers)

CAPACITY = 16
LEASE = 3_600_000  # an hour: nothing expires while a row is filled (under valgrind too)


keys = si.lease_keys


class Server:
    def __init__(self, callgrind):
        self.port = si.free_port()
        self.dir = si.tempfile.mkdtemp(prefix="redsem-ts-")
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", self.dir]
        if callgrind:
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={self.dir}/out"] + cmd
        self.callgrind = callgrind
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.r = redis.Redis(port=self.port, decode_responses=True)
        for _ in range(600):
            try:
                self.r.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.1)
        raise SystemExit("redis-server did not start")

    def instrument(self, on):
        subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(self.proc.pid)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)

    def count(self):
        """Instructions since the last count (callgrind's dump)."""
        return si.dump_count(self.dir, self.proc.pid)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def row(server, name, tenants, waiters, grants):
    """Fill, then time `grants` releases that each grant one waiter; returns (usec per release,
    instructions per release or None, state after)."""
    r, k = server.r, keys(name)
    seq = 0

    def acquire(pid, tenant):
        nonlocal seq
        seq += 1
        return si.op("scripts", "lease_acquire", k, pid, CAPACITY, 1, LEASE, "", "0", "wait",
                     LEASE, "c", si.h(seq), "sess", si.h(seq), tenant, "1" if tenant else "", "")

    tenant_of = (lambda i: "") if tenants == 0 else (lambda i: f"t{i % tenants:05d}")
    holders = []
    pipe = r.pipeline(transaction=False)
    for i in range(CAPACITY):
        pid = uuid.uuid4().hex
        holders.append(pid)
        pipe.execute_command(*acquire(pid, tenant_of(i)))
    for reply in pipe.execute():
        assert reply[0] == "GRANTED", reply
    for start in range(0, waiters, 2_000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(start + 2_000, waiters)):
            pipe.execute_command(*acquire(uuid.uuid4().hex, tenant_of(CAPACITY + i)))
        for reply in pipe.execute():
            assert reply[0] == "QUEUED", reply
    r.config_resetstat()
    if server.callgrind:
        server.instrument(True)
        server.count()
    for _ in range(grants):
        seq += 1
        reply = r.execute_command(*si.op("scripts", "lease_release", k, holders.pop(0), "c",
                                         si.h(seq), "sess", si.h(seq), "r"))
        assert reply[0] == "RELEASED" and len(reply) == 3, reply
        holders.append(reply[2].split("|")[0])
    instructions = None
    if server.callgrind:
        instructions = server.count() / grants
        server.instrument(False)
    fcall = r.info("commandstats").get("cmdstat_fcall", {})
    usec = fcall.get("usec", 0) / max(fcall.get("calls", 1), 1)
    state = r.hmget(k[2], "used", "qlen", "tn", "layout")
    r.delete(*k)
    return usec, instructions, state


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--waiters", type=int, default=100_000)
    ap.add_argument("--grants", type=int, default=2_000)
    ap.add_argument("--tenants", default="1,10,1000,10000")
    ap.add_argument("--callgrind", action="store_true")
    a = ap.parse_args()
    server = Server(a.callgrind)
    try:
        server.r.function_load(si.library(), replace=True)
        print(f"{a.waiters:,} waiters, capacity {CAPACITY}, {a.grants:,} releases each granting "
              f"one waiter; load average {open('/proc/loadavg').read().split()[:3]}")
        print(f"{'row':>14} {'usec/release':>13} {'instructions/release':>21}  used/qlen/tn/layout after")
        for tenants in [0] + [int(t) for t in a.tenants.split(",")]:
            usec, ir, state = row(server, f"ts{tenants}", tenants, a.waiters, a.grants)
            label = "fifo" if tenants == 0 else f"{tenants:,} tenants"
            irs = f"{ir / 1000:,.1f} k" if ir is not None else "-"
            print(f"{label:>14} {usec:>13.1f} {irs:>21}  {'/'.join(str(s) for s in state)}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
