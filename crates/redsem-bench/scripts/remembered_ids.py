#!/usr/bin/env python3
"""What retry safety costs Redis at a sustained rate: the ids every cycle leaves behind.

Written for layout 1, before client sessions: every uncontended cycle left ids that the
scripts remembered for a minute, so that a call resent after a lost reply is applied once: a
lease release's tombstone (in `leases` and the state hash), a permit request's and a release's
id (in `applied`, and the request's record). Its calls carry no session numbers; the scripts of
layout 2 keep one record per client session instead, and redsem-bench's S11 measures what they
keep at a sustained rate (docs/BENCHMARKS.md). This runs one primitive flat out for longer
than a minute and prints, every 10 s, the rate, the server time spent inside the scripts per
cycle (commandstats), the size of the set that held the remembered ids and Redis's memory.

It starts a throwaway `redis-server` on a free port of 127.0.0.1, loads the function library
of *this checkout* (as `server_instructions.py` assembles it), and sends uncontended
try_acquire + release cycles in pipelines of 200 on one connection.

Usage: python3 crates/redsem-bench/scripts/remembered_ids.py lease|permits [seconds]   (default 90)
Needs redis-server and the `redis` Python package.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import redis

from server_instructions import lease_keys, library

PER_PIPELINE = 200
REPORT_EVERY = 10.0


def start_server():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", tempfile.mkdtemp(prefix="redsem-ids-")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port, decode_responses=True)
    for _ in range(100):
        try:
            r.ping()
            return proc, r
        except redis.ConnectionError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("redis-server did not start")


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("lease", "permits"):
        raise SystemExit(__doc__)
    kind = sys.argv[1]
    seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 90
    proc, r = start_server()
    try:
        r.function_load(library(), replace=True)
        lease = lease_keys("u")
        permits = [f"b:{{permits:p}}:{part}" for part in ["count", "queue", "waiters", "records", "meta", "applied"]]
        if kind == "permits":
            r.execute_command("FCALL", "rx_permit_try_set", 6, *permits, "set", 8)
        remembered = lease[0] if kind == "lease" else permits[5]
        print(f"{kind}: uncontended cycles, {PER_PIPELINE} per pipeline, {seconds} s")
        print("    t   cycles/s   script µs/cycle   ZADD µs/cycle   remembered   used_memory")
        started = window = time.time()
        cycles = 0
        r.config_resetstat()
        while time.time() - started < seconds:
            pipe = r.pipeline(transaction=False)
            for _ in range(PER_PIPELINE):
                pid = uuid.uuid4().hex
                if kind == "lease":
                    pipe.execute_command("FCALL", "rx_lease_acquire", len(lease), *lease, pid, 8, 1, 30000, "", "0", "try",
                                         3000, "c")
                    pipe.execute_command("FCALL", "rx_lease_release", len(lease), *lease, pid, "c", "a" + pid)
                else:
                    pipe.execute_command("FCALL", "rx_permit_acquire", 6, *permits, pid, 1, "try", 3000, "c")
                    pipe.execute_command("FCALL", "rx_permit_add", 6, *permits, "r" + pid, 1)
            for reply in pipe.execute(raise_on_error=True):
                if isinstance(reply, list) and reply and reply[0] not in ("GRANTED", "RELEASED", "ADDED"):
                    raise SystemExit(f"unexpected reply {reply}")
            cycles += PER_PIPELINE
            now = time.time()
            if now - window >= REPORT_EVERY:
                stats = r.info("commandstats")
                script = stats["cmdstat_fcall"]["usec"] / cycles
                zadd = stats.get("cmdstat_zadd", {}).get("usec", 0) / cycles
                size = r.zcard(remembered)
                memory = r.info("memory")["used_memory"] / 2**20
                print(f"{now - started:5.0f}   {cycles / (now - window):8.0f}   {script:15.1f}   {zadd:13.1f}"
                      f"   {size:10d}   {memory:8.0f} MB", flush=True)
                r.config_resetstat()
                window, cycles = time.time(), 0
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
