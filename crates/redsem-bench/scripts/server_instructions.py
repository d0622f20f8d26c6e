#!/usr/bin/env python3
"""Instructions Redis executes per semaphore cycle, counted by valgrind's callgrind.

With `--module PATH` the server loads the native engine (crates/redsem-module's
libredsem_module.so, built with `cargo build --release -p redsem-module`; it runs this
checkout's Lua, below, for the calls it has no native path for) and every semaphore row is
counted a second time in the same run, sent as the module's `REDSEM.<OPERATION>` commands (same
keys, same ARGV, same replies) in place of `FCALL`: `lease/native`, `contended/native`, ... And
one more row, `ping` (two PINGs: the floor of two commands' dispatch).

Usage: python3 server_instructions.py [cycles] [--module PATH [--module-args "ARG ..."]] [--only-lease]
(--module-args: more load arguments, e.g. `noreplicate`, which measures what replicating the
native paths' writes costs; --only-lease: stop after the lease rows.)

Wall-clock and `INFO cpu` figures swing by 2-3x on a shared machine; an instruction count does
not (the same binary and inputs give the same count whatever else runs). This starts a
throwaway `redis-server` under callgrind, loads the Lua of *this checkout*
(`crates/redsem/lua`, assembled as `script/library.rs` assembles it), and counts what the
server executes per cycle (network handling, command dispatch and the scripts):

  polling     the polling baseline of redsem-bench (S9): its EVALSHA attempt + ZREM
  lease       try acquire + release, one client (one session), uncontended, on a semaphore primed
              by one cycle (its state and session record made before the count)
  floor       the commands of that cycle alone (TIME, HMGET, BITPOS, SETBIT, ZADD, HSET; TIME,
              HMGET, SETBIT, ZREM, HSET, HDEL: layout 2, the release's mark in its session's
              record) issued by two functions with no logic, on the same keys and arguments:
              what any script issuing those commands costs at least
  contended   capacity 8, 8 holders, 56 queued: release the oldest holder (which grants the
              head waiter) and queue a new waiter, one call each
  batched     the same contended cycle, 8 cycles to one lease_batch call (group commit)
  permits     permit semaphore try_acquire(1) + release(1), primed by one cycle
  p-floor     the commands of that cycle alone, layout 2 (TIME, HMGET, GET, INCRBY, HSET; TIME,
              HMGET, INCRBY, HSET: each call's mark in its session's record), issued by two
              functions with no logic
  p-contend   8 permits, 8 taken, 56 queued: release one (which serves the head waiter) and
              queue a new waiter, one call each
  p-batched   the same, 8 cycles to one permit_batch call (group commit)

Usage: python3 crates/redsem-bench/scripts/server_instructions.py [cycles]   (default 300)
Needs valgrind, redis-server and the `redis` Python package.
"""
import glob
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
LUA = os.path.join(ROOT, "crates", "redsem", "lua")
LIBRARY_RS = os.path.join(ROOT, "crates", "redsem", "src", "script", "library.rs")
ARGS = sys.argv[1:] if __name__ == "__main__" else []
MODULE = os.path.abspath(ARGS[ARGS.index("--module") + 1]) if "--module" in ARGS else None
MODULE_ARGS = ARGS[ARGS.index("--module-args") + 1].split() if "--module-args" in ARGS else []
ONLY_LEASE = "--only-lease" in ARGS
POSITIONAL = [a for i, a in enumerate(ARGS)
              if not a.startswith("--") and (i == 0 or ARGS[i - 1] not in ("--module", "--module-args"))]
CYCLES = int(POSITIONAL[0]) if POSITIONAL else 300
OPS = {
    "latch": ["latch_try_set", "latch_count_down", "latch_state", "latch_delete"],
    "lease": ["lease_acquire", "lease_batch", "lease_poll", "lease_refresh", "lease_release",
              "lease_status", "lease_set_capacity", "lease_tidy"],
    "permit": ["permit_acquire", "permit_batch", "permit_poll", "permit_withdraw", "permit_add", "permit_try_set",
               "permit_available", "permit_drain", "permit_delete"],
}
POLL_LUA = os.path.join(ROOT, "crates", "redsem-bench", "src", "poll_attempt.lua")


def h(n):
    """A session number as the scripts read it: hexadecimal text (lua/common.lua)."""
    return format(n, "x")


def poll_attempt():
    """The polling baseline's attempt script, as redsem-bench sends it (src/poll_attempt.lua)."""
    return open(POLL_LUA).read()


def lua_file(primitive, op):
    """The path of an operation's Lua file: lua/<primitive>/<op>.lua (lua/<primitive>_<op>.lua
    in an older checkout)."""
    path = os.path.join(LUA, primitive, op[len(primitive) + 1:] + ".lua")
    return path if os.path.exists(path) else os.path.join(LUA, op + ".lua")


def prelude_files(primitive):
    """A primitive's prelude files, in the order script/library.rs joins them (its
    <PRIMITIVE>_PRELUDE list); one file, lua/<primitive>_prelude.lua, in an older checkout."""
    source = open(LIBRARY_RS).read() if os.path.exists(LIBRARY_RS) else ""
    found = re.search(r"const %s_PRELUDE[^=]*=\s*lua_files!\[(.*?)\]" % primitive.upper(), source, re.S)
    names = re.findall(r'"([^"]+)"', found.group(1)) if found else [primitive + "_prelude"]
    return [os.path.join(LUA, name + ".lua") for name in names]


def library():
    """The function library from the Lua files, as script/library.rs builds it."""
    read = lambda path: open(path).read()
    source = "#!lua name=rx\n" + read(os.path.join(LUA, "common.lua")) + "\n"
    for primitive in ["latch", "lease", "permit"]:
        source += "do\n" + "".join(read(path) for path in prelude_files(primitive))
        for op in OPS[primitive]:
            if not os.path.exists(lua_file(primitive, op)):
                continue  # (an older checkout: lease_batch came with group commit)
            source += (f"redis.register_function('rx_{op}', function(KEYS, ARGV)\nbegin(KEYS)\n"
                       + read(lua_file(primitive, op)) + "\nend)\n")
        source += "end\n"
    return source


def free_port():
    """A port nothing listens on now, for a throwaway server."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def dump_count(directory, pid):
    """Have callgrind (process `pid`, writing `directory`/out*) dump its counts, and return the
    instructions executed since its last dump."""
    before = set(glob.glob(f"{directory}/out*"))
    subprocess.run(["callgrind_control", "--dump", str(pid)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    for _ in range(300):
        new = sorted(set(glob.glob(f"{directory}/out*")) - before)
        if new:
            time.sleep(0.3)  # written in full
            for line in open(new[-1]):
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
        time.sleep(0.1)
    raise SystemExit("callgrind wrote no dump")


class Server:
    """redis-server under callgrind; `count()` dumps and returns the instructions since the last."""

    def __init__(self):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redsem-ir-")
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.dir}/out",
             "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir]
            + (["--loadmodule", MODULE, "library", "rx", *MODULE_ARGS] if MODULE else []),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.r = redis.Redis(port=self.port, decode_responses=True)
        for _ in range(600):
            try:
                self.r.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.1)
        raise SystemExit("redis-server under valgrind did not start")

    def count(self):
        return dump_count(self.dir, self.proc.pid)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


# The uncontended cycle's commands with no logic around them (the `floor` row): not a
# semaphore, a measure of what the commands and the calls cost by themselves.
FLOOR = r"""#!lua name=floor
redis.register_function('floor_acquire', function(K, A)
  redis.call('TIME')
  redis.call('HMGET', K[3], 'cap', 'used', 'qlen', 'seq', 'idle', 'tok', 'nh', 'nt', 'next', 'tnext',
    'layout', 'r:' .. A[1], 's:sess')
  local slot = redis.call('BITPOS', K[4], '0')
  redis.call('SETBIT', K[4], slot, '1')
  redis.call('ZADD', K[1], '1764200000123', A[1])
  redis.call('HSET', K[3], 'used', '1', 'nh', '1', 'tok', '1764200000123456',
    'r:' .. A[1], 'h|1764200000123456|1|1764200000123|30000|0|')
  return { 'GRANTED', 1764200000123456, slot }
end)
redis.register_function('floor_release', function(K, A)
  redis.call('TIME')
  redis.call('HMGET', K[3], 'cap', 'used', 'qlen', 'seq', 'idle', 'tok', 'nh', 'nt', 'next', 'tnext',
    'layout', 'r:' .. A[1], 's:sess')
  redis.call('SETBIT', K[4], '0', '0')
  redis.call('ZREM', K[1], A[1])
  redis.call('HSET', K[3], 'used', '0', 'nh', '0', 's:sess', A[3] .. '|1764200600123|,' .. A[3] .. '=R')
  redis.call('HDEL', K[3], 'r:' .. A[1])
  return { 'RELEASED', 1 }
end)
redis.register_function('floor_permit_acquire', function(K, A)
  redis.call('TIME')
  redis.call('HMGET', K[4], 'keep', 'prune', 'wlen', 'wnext', 'qlen', 'live', 'wide', 'layout', 'r:' .. A[1],
    's:psess')
  redis.call('GET', K[1])
  redis.call('INCRBY', K[1], '-1')
  redis.call('HSET', K[4], 's:psess', A[6] .. '|1764200600123|' .. A[6] .. '|,' .. A[6] .. '=G1')
  return { 'GRANTED' }
end)
redis.register_function('floor_permit_add', function(K, A)
  redis.call('TIME')
  redis.call('HMGET', K[4], 'keep', 'prune', 'wlen', 'wnext', 'qlen', 'live', 'wide', 'layout', 'keep',
    's:psess')
  local count = redis.call('INCRBY', K[1], '1')
  redis.call('HSET', K[4], 's:psess', A[3] .. '|1764200600123|' .. A[3] .. '|,' .. A[3] .. '=A')
  return { 'ADDED', count }
end)
"""


def lease_keys(name):
    return [f"b:{{lease:{name}}}:{part}" for part in ["leases", "queue", "state", "slots", "tenants", "tqueue"]]


def permit_keys(name):
    return [f"b:{{permits:{name}}}:{part}" for part in ["count", "queue", "waiters", "records", "meta", "applied"]]


ENGINES = ["scripts", "native"] if MODULE else ["scripts"]


def op(engine, name, keys, *args):
    """The call of operation `name` on `keys` with `args`: an FCALL of this checkout's library,
    or the module's command."""
    if engine == "native":
        return [f"REDSEM.{name.upper()}", *keys, *args]
    return ["FCALL", f"rx_{name}", len(keys), *keys, *args]


def main():
    server = Server()
    r = server.r
    try:
        r.function_load(library(), replace=True)
        poll = r.script_load(poll_attempt())

        def measure(label, commands, cycles, engine="scripts"):
            label = label if engine == "scripts" else f"{label}/{engine}"
            server.count()
            r.config_resetstat()
            pipe = r.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            for reply in pipe.execute(raise_on_error=True):
                if isinstance(reply, list) and reply and reply[0] in ("WRONGTYPE", "LAYOUT"):
                    raise SystemExit(f"{label}: {reply}")
            total = server.count()
            stats = r.info("commandstats")
            # Commands the client sent itself; the rest ran inside the scripts.
            sent = {"cmdstat_fcall", "cmdstat_evalsha", "cmdstat_config", "cmdstat_info", "cmdstat_ping"}
            sent |= {k for k in stats if k.startswith("cmdstat_redsem.")}
            if label == "polling":
                sent.add("cmdstat_zrem")
            inside = sum(v["calls"] for k, v in stats.items() if k not in sent)
            print(f"{label:18} {total / cycles / 1000:8.1f} k instructions per cycle"
                  f"   {inside / cycles:5.1f} commands inside", flush=True)

        ids = [uuid.uuid4().hex for _ in range(CYCLES)]
        now = int(time.time() * 1000)
        commands = []
        for i, pid in enumerate(ids):
            commands.append(["EVALSHA", poll, 1, "b:poll", 8, pid, now + i, 30000])
            commands.append(["ZREM", "b:poll", pid])
        measure("polling", commands, CYCLES)

        # One client session (layout 2): every call numbered, the low mark at the call's own
        # number (everything before it answered), so each release's mark replaces the last.
        for engine in ENGINES:
            k = lease_keys("u-" + engine)
            # Primed by one cycle (its state and session record made) before the count.
            r.execute_command(*op(engine, "lease_acquire", k, "prime", 8, 1, 30000, "", "0", "try", 3000, "c",
                                  h(1), "sess", h(1)))
            r.execute_command(*op(engine, "lease_release", k, "prime", "c", h(2), "sess", h(2), "r"))
            commands = []
            for i, pid in enumerate(ids):
                a, rel = 2 * i + 3, 2 * i + 4
                commands.append(op(engine, "lease_acquire", k, pid, 8, 1, 30000, "", "0", "try", 3000, "c",
                                   h(a), "sess", h(a)))
                commands.append(op(engine, "lease_release", k, pid, "c", h(rel), "sess", h(rel), "r"))
            measure("lease", commands, CYCLES, engine)

        r.function_load(FLOOR, replace=True)
        f = lease_keys("f")[:4]  # (the floor's functions take the four keys its commands touch)
        r.hset(f[2], mapping={"layout": "1", "wide": "-" * 80})  # a hash table, as redsem's
        commands = []
        for i, pid in enumerate(ids):
            commands.append(["FCALL", "floor_acquire", 4, *f, pid, 8, 1, 30000, "", "0", "try", 3000, "c"])
            commands.append(["FCALL", "floor_release", 4, *f, pid, "c", str(2 * i + 2)])
        measure("floor", commands, CYCLES)
        if MODULE:
            measure("ping", [["PING"]] * (2 * CYCLES), CYCLES)
        if ONLY_LEASE:
            return

        def contended(engine, name, per_call):
            k = lease_keys(f"{name}-{engine}")
            holders, waiters = [], []
            seq = 0
            for i in range(64):
                pid = uuid.uuid4().hex
                seq += 1
                r.execute_command(*op(engine, "lease_acquire", k, pid, 8, 1, 30000, "", "0", "wait", 30000, "c",
                                      h(seq), "sess", h(seq)))
                (holders if i < 8 else waiters).append(pid)
            commands = []
            for _ in range(CYCLES // per_call):
                ops, low = [], seq + 1
                for _ in range(per_call):
                    old, pid = holders.pop(0), uuid.uuid4().hex
                    holders.append(waiters.pop(0))
                    waiters.append(pid)
                    if per_call == 1:
                        commands.append(op(engine, "lease_release", k, old, "c", h(seq + 1), "sess", h(seq + 1), "r"))
                        commands.append(op(engine, "lease_acquire", k, pid, 8, 1, 30000, "", "0", "wait", 30000,
                                           "c", h(seq + 2), "sess", h(seq + 2)))
                    else:
                        ops += ["r", old, h(seq + 1), "a", pid, 8, 1, 30000, "", "0", "wait", 30000, h(seq + 2),
                                "", "", ""]
                    seq += 2
                if ops:
                    commands.append(op(engine, "lease_batch", k, "c", "sess", h(low), *ops))
            return commands, k

        for engine in ENGINES:
            measure("contended", contended(engine, "c", 1)[0], CYCLES, engine)
        if os.path.exists(lua_file("lease", "lease_batch")):
            for engine in ENGINES:
                commands, k = contended(engine, "b", 8)
                measure("batched", commands, CYCLES // 8 * 8, engine)
                state = r.hmget(k[2], "used", "qlen")
                if state != ["8", "56"]:
                    raise SystemExit(f"the batched run left used/qlen {state}, not 8/56")

        for engine in ENGINES:
            p = permit_keys("p-" + engine)
            r.execute_command(*op(engine, "permit_try_set", p, "set", 8, h(1), "psess", h(1)))
            # Primed by one cycle (its session record made) before the count.
            r.execute_command(*op(engine, "permit_acquire", p, "prime", 1, "try", 3000, "c", h(2), "psess", h(2)))
            r.execute_command(*op(engine, "permit_add", p, "rprime", 1, h(3), "psess", h(3)))
            commands = []
            for i, pid in enumerate(ids):
                a, rel = 2 * i + 4, 2 * i + 5
                commands.append(op(engine, "permit_acquire", p, pid, 1, "try", 3000, "c", h(a), "psess", h(a)))
                commands.append(op(engine, "permit_add", p, "r" + pid, 1, h(rel), "psess", h(rel)))
            measure("permits", commands, CYCLES, engine)

        f = permit_keys("f")
        r.set(f[0], 8)
        r.hset(f[3], mapping={"keep": "1", "wide": "-" * 80})  # a hash table, as redsem's
        commands = []
        for i, pid in enumerate(ids):
            commands.append(["FCALL", "floor_permit_acquire", 6, *f, pid, 1, "try", 3000, "c", str(2 * i + 2)])
            commands.append(["FCALL", "floor_permit_add", 6, *f, "r" + pid, 1, str(2 * i + 3)])
        measure("p-floor", commands, CYCLES)

        def permits_contended(engine, name, per_call):
            """8 permits, 8 taken, 56 queued: release one (which serves the head waiter) and
            queue a new waiter; `per_call` cycles to one permit_batch call (1: one call each)."""
            q = permit_keys(f"{name}-{engine}")
            seq = 1
            r.execute_command(*op(engine, "permit_try_set", q, "set", 8, h(seq), "psess", h(seq)))
            for _ in range(64):
                seq += 1
                r.execute_command(*op(engine, "permit_acquire", q, uuid.uuid4().hex, 1, "wait", 30000, "c",
                                      h(seq), "psess", h(seq)))
            commands = []
            for _ in range(CYCLES // per_call):
                ops, low = [], seq + 1
                for _ in range(per_call):
                    rid, pid = uuid.uuid4().hex, uuid.uuid4().hex
                    if per_call == 1:
                        commands.append(op(engine, "permit_add", q, rid, 1, h(seq + 1), "psess", h(seq + 1)))
                        commands.append(op(engine, "permit_acquire", q, pid, 1, "wait", 30000, "c",
                                           h(seq + 2), "psess", h(seq + 2)))
                    else:
                        ops += ["m", rid, 1, h(seq + 1), "a", pid, 1, "wait", 30000, h(seq + 2)]
                    seq += 2
                if ops:
                    commands.append(op(engine, "permit_batch", q, "c", "psess", h(low), *ops))
            return commands, q

        for engine in ENGINES:
            measure("p-contend", permits_contended(engine, "pc", 1)[0], CYCLES, engine)
        if os.path.exists(lua_file("permit", "permit_batch")):
            for engine in ENGINES:
                commands, q = permits_contended(engine, "pb", 8)
                measure("p-batched", commands, CYCLES // 8 * 8, engine)
                if r.hget(q[3], "qlen") != "56":
                    raise SystemExit("the batched permit run did not keep 56 waiters queued")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
