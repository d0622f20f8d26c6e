#!/usr/bin/env python3
"""Does the module's cycle leave the keys as the scripts' does?

Starts a throwaway redis-server with the module loaded (a free port, never 6379) and a replica
of it *without* the module, loads the scripts' library (as server_instructions.py assembles
it), primes two semaphores with one FCALL cycle each, then runs cycles on both, one by FCALL,
one by the module's commands (same ids, same session numbers), and compares after every
acquire and every release: the replies, the state hash (every field; times and tokens, which
differ between two calls, replaced by T), the leases zset (members; scores shaped the same way)
and the slot bitmap, on the primary and on the replica (the module's writes must reach it as
plain commands). Also checks that a call the fast path cannot take changes nothing.

Usage: python3 check.py path/to/libnative_lease.so
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import redis

sys.argv = sys.argv[:2]
MODULE = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "redsem-bench", "scripts"))
import server_instructions as si  # noqa: E402  (library(), lease_keys(), h())


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    assert port != 6379
    return port


def start(port, *extra):
    d = tempfile.mkdtemp(prefix="native-lease-")
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", d, *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port, decode_responses=True)
    for _ in range(100):
        try:
            r.ping()
            return proc, r
        except redis.ConnectionError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def shape(value):
    """Times and tokens (10+ digits; a session record's expiry, 10+ hex digits) differ from
    call to call: T."""
    if not isinstance(value, str):
        return value
    return re.sub(r"\d{10,}", "T", re.sub(r"\|[0-9a-f]{10,}\|", "|T|", value))


def raw(r):
    """The same server, bytes not text (the slot bitmap is binary)."""
    return redis.Redis(port=r.connection_pool.connection_kwargs["port"])


def snapshot(r, name):
    k = si.lease_keys(name)
    state = {f: shape(v) for f, v in r.hgetall(k[2]).items()}
    leases = [(m, shape(str(int(s)))) for m, s in r.zrange(k[0], 0, -1, withscores=True)]
    return {"state": state, "leases": leases, "queue": r.zrange(k[1], 0, -1), "slots": raw(r).get(k[3]),
            "types": [r.type(key) for key in k]}


def main():
    p_port, s_port = free_port(), free_port()
    primary, r = start(p_port, "--loadmodule", MODULE, "--repl-diskless-sync-delay", "0")
    replica, rr = start(s_port, "--replicaof", "127.0.0.1", str(p_port))
    try:
        for _ in range(200):
            if rr.info("replication").get("master_link_status") == "up":
                break
            time.sleep(0.05)
        else:
            raise SystemExit("the replica did not connect")
        r.function_load(si.library(), replace=True)
        h = si.h
        ids = [uuid.uuid4().hex for _ in range(6)]
        checks = 0
        for name in ["s", "n"]:
            k = si.lease_keys(name)
            r.execute_command("FCALL", "rx_lease_acquire", 4, *k, "prime", 8, 1, 30000, "", "0", "try", 3000, "c",
                              h(1), "sess", h(1))
            r.execute_command("FCALL", "rx_lease_release", 4, *k, "prime", "c", h(2), "sess", h(2), "r")
        ks, kn = si.lease_keys("s"), si.lease_keys("n")

        def both(script_cmd, native_cmd):
            nonlocal checks
            a = r.execute_command(*script_cmd)
            b = r.execute_command(*native_cmd)
            assert [shape(str(x)) for x in a] == [shape(str(x)) for x in b], (a, b)
            sa, sb = snapshot(r, "s"), snapshot(r, "n")
            assert sa == sb, f"\nscripts {sa}\nnative  {sb}"
            checks += 1
            return a, b

        seq = 2
        # Up to 3 holders at once (slots 0..2, BITPOS over set bits), released out of order.
        held = []
        for step, pid in enumerate(ids):
            seq += 1
            argv = [pid, 8, 1, 30000, "", "0", "try", 3000, "c", h(seq), "sess", h(seq)]
            a, b = both(["FCALL", "rx_lease_acquire", 4, *ks, *argv], ["RXN.LEASE_ACQUIRE", 4, *kn, *argv])
            assert a[0] == "GRANTED" and b[0] == "GRANTED" and a[2] == b[2], (a, b)
            assert b[1] > a[1] - 10**6, "the token is a microsecond time"
            held.append(pid)
            if len(held) == 3 or step == len(ids) - 1:
                for pid in [held[1], held[0], held[2]][:len(held)] if len(held) == 3 else held:
                    seq += 1
                    argv = [pid, "c", h(seq), "sess", h(seq), "r"]
                    a, b = both(["FCALL", "rx_lease_release", 4, *ks, *argv], ["RXN.LEASE_RELEASE", 4, *kn, *argv])
                    assert a[0] == "RELEASED", a
                held = []
        print("after", checks, "calls each: the same replies and keys (times and tokens aside):")
        for part, value in snapshot(r, "n").items():
            print(f"  {part:7} {value}")

        # The replica (no module loaded) holds what the primary holds.
        r.execute_command("WAIT", 1, 2000)
        for key in ks + kn:
            t = r.type(key)
            got = {"hash": lambda c: c.hgetall(key), "zset": lambda c: c.zrange(key, 0, -1, withscores=True),
                   "string": lambda c: raw(c).get(key), "none": lambda c: None}[t]
            assert got(r) == got(rr), (key, got(r), got(rr))
        print("the replica, without the module, holds the same", len(ks + kn), "keys, exactly")

        # A call the fast path cannot take changes nothing: a resend of a released holder's
        # release (the scripts answer it from the session's mark), two units, a label.
        before = {k: raw(r).dump(k) for k in kn}
        for cmd in [["RXN.LEASE_RELEASE", 4, *kn, ids[-1], "c", h(seq), "sess", h(seq), "r"],
                    ["RXN.LEASE_ACQUIRE", 4, *kn, "x", 8, 2, 30000, "", "0", "try", 3000, "c", h(seq + 1), "sess", h(seq + 1)],
                    ["RXN.LEASE_ACQUIRE", 4, *kn, "x", 8, 1, 30000, "lab", "0", "try", 3000, "c", h(seq + 1), "sess", h(seq + 1)]]:
            try:
                r.execute_command(*cmd)
                raise SystemExit(f"{cmd[0]} answered outside its fast path")
            except redis.ResponseError as e:
                assert str(e).startswith("NOTFAST"), e
        assert before == {k: raw(r).dump(k) for k in kn}
        print("calls outside the fast paths answer NOTFAST and change nothing")
        print("RXN.NOOP ->", r.execute_command("RXN.NOOP"))
    finally:
        for proc in (replica, primary):
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
