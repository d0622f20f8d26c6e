-- latch/prelude: the latch's keys, records and rules, after common.lua and in front of every
-- latch operation, so every operation sees the same KEYS layout and helpers.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 count    STRING the count, 1 .. 2^53 - 1; absent when never set, opened (reached 0) or
--                     deleted. Never expires.
--   2 done     STRING for DONE_MS after the latch stopped counting: "1" it opened (reached 0),
--                     "deleted" it was deleted while counting. Tells both from "never set" (a
--                     waiter that saw the count and then finds none of the three knows the
--                     state was lost)
--   3 applied  ZSET   s:<session> -> the expiry of that client session's record (ms of Redis
--                     time): the index by which the records of sessions gone quiet are pruned.
--                     (Before client sessions it held request ids, remembered a minute; any
--                     left are pruned the same way.)
--   4 sessions HASH   s:<session> -> the client session's record (see common.lua): a
--                     count_down marks its sequence number C, a try_set T, so the same call
--                     resent after a lost reply is applied once, and a late copy of a call
--                     answered (below the low mark) is never applied
--
-- Expiry (keep-alive, see common.lua): while the latch counts, no key has a TTL: the
-- session records are pruned by the scripts (their expiry, in applied). Once it opened, done
-- is kept DONE_MS and the records SESSION_MS, so that a count-down resent after a lost
-- reply still finds its mark; a deleted latch keeps nothing but done.
--
-- Failures: every script reaches each key it may write with a read (or a write that cannot
-- harm) before it writes anything, so a foreign value aborts it before its first write, and
-- run() answers WRONGTYPE. A latch has no fields to load or settle: run() catches failures,
-- writes back the caller's session record, gives TTLs and publishes "opened" last.
--
-- Cost: scripts make few calls, each O(1) or O(log n) but the occasional prune of records
-- past their expiry (at most PRUNE_BATCH).
local COUNT, DONE, APPLIED, SESSIONS

-- How long an opened latch is reported as done rather than never set.
local DONE_MS = 3600000
-- Records past their expiry are dropped on about one call in PRUNE_ONE_IN (by the time's low
-- bits), at most PRUNE_BATCH at a time.
local PRUNE_ONE_IN = 16
local PRUNE_BATCH = 1000

-- The count (1 .. 2^53 - 1); nil if absent. A value that is not a count is foreign.
local function read_count()
  return read_integer(COUNT, true)
end

-- Whether the call numbered `seq` of session `sid` (low mark `low`) was seen: applied already
-- (marked in the session's record) or a late copy of a call answered (below the low mark).
-- Reads the caller's record: the first access of sessions and applied (a foreign value in
-- either is reported by every call that reads or writes the count).
local function seen(seq, sid, low)
  open_session(sid, low)
  S[S.sess] = call(SESSIONS, 'HGET', SESSIONS, S.sess)
  call(APPLIED, 'ZCARD', APPLIED)
  return session_stale(seq) or session_mark(seq) ~= nil
end

-- Mark the call numbered `seq` with `letter` in the caller's record (raising its low mark),
-- register a new or renewed record's expiry in applied, and now and then drop the records
-- past theirs. Sets no TTL: the caller does once the latch stops counting.
local function mark(seq, letter)
  local value, renewed = session_put(S.low, seq, letter)
  put(S.sess, value)
  if renewed then
    call(APPLIED, 'ZADD', APPLIED, digits(renewed), S.sess)
  end
  if S.now % PRUNE_ONE_IN == 0 then
    local due = call(APPLIED, 'ZRANGEBYSCORE', APPLIED, '-inf', S.now, 'LIMIT', 0, PRUNE_BATCH)
    if #due > 0 then
      redis.call('ZREM', APPLIED, unpack(due))
      for _, name in ipairs(due) do
        put(name, false)
      end
    end
  end
end

-- Start a call: its keys and a fresh per-call state (no hooks: nothing to load or settle).
local HOOKS = {}
local function expected()
  return { [COUNT] = 'integer', [DONE] = 'string', [APPLIED] = 'zset', [SESSIONS] = 'hash' }
end
local function begin(keys)
  COUNT, DONE, APPLIED, SESSIONS = keys[1], keys[2], keys[3], keys[4]
  start(SESSIONS, expected, HOOKS)
end
