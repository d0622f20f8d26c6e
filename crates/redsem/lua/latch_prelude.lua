-- latch_prelude: shared by every latch_*.lua script; joined in front of each one at compile
-- time, so every script sees the same KEYS layout and helpers.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 count    STRING the count, 1 .. 2^53 - 1; absent when never set, opened (reached 0) or
--                     deleted. Never expires.
--   2 done     STRING for DONE_MS after the latch stopped counting: "1" it opened (reached 0),
--                     "deleted" it was deleted while counting. Tells both from "never set" (a
--                     waiter that saw the count and then finds none of the three knows the
--                     state was lost)
--   3 applied  ZSET   request id -> forget-at, ms of Redis time: try_set and count_down calls
--                     applied, remembered REMEMBER_MS so a repeated call is applied once
--
-- Expiry: while the latch counts, no key has a TTL (no volatile-* eviction policy can pick
-- one): applied is pruned by the scripts. Once it opened or was deleted, done and applied are
-- idle state and expire.
--
-- Failures: every script reaches each key it may write with a read (or a write that cannot
-- harm) before it writes anything, so a foreign value aborts it before its first write, and
-- run() answers WRONGTYPE; "opened" is published last, with redis.pcall: a refused PUBLISH
-- (an ACL without channel rights) costs the waiters one re-check, never a failed call.
--
-- Cost: every redis.call costs about a microsecond, so scripts make few, each O(1) or
-- O(log n) but the occasional prune of ids past their time.
local COUNT, DONE, APPLIED

-- How long an applied id is remembered (a retry comes within seconds).
local REMEMBER_MS = 60000
-- How long an opened latch is reported as done rather than never set.
local DONE_MS = 3600000
-- Ids past their time are dropped on about one call in PRUNE_ONE_IN (by the time's low bits).
local PRUNE_ONE_IN = 16
-- Redis scripts count in doubles.
local MAX_COUNT = 9007199254740991

local EXPECTED

-- Start a call: its keys. (Loaded as a function library, this file's helpers outlive a call.)
local function begin(keys)
  COUNT, DONE, APPLIED = keys[1], keys[2], keys[3]
  EXPECTED = { [COUNT] = 'integer', [DONE] = 'string', [APPLIED] = 'zset' }
end

-- The count; nil if absent. A value that is not a count is foreign.
local function read_count()
  local count = call(COUNT, 'GET', COUNT)
  if count and (not string.match(count, '^%d+$') or tonumber(count) > MAX_COUNT) then
    error({ key = COUNT })
  end
  return tonumber(count)
end

-- Remember `id` until REMEMBER_MS after `now`, unless it is remembered already: true if
-- it was. The first access of applied in the scripts that write. Sets no TTL: the caller
-- does once the latch stops counting.
local function remember(id, now)
  local forget = now + REMEMBER_MS
  if call(APPLIED, 'ZADD', APPLIED, 'NX', forget, id) == 0 then
    if tonumber(redis.call('ZSCORE', APPLIED, id)) > now then
      return true
    end
    -- Past its time, but not dropped yet.
    redis.call('ZADD', APPLIED, forget, id)
  end
  if now % PRUNE_ONE_IN == 0 then
    redis.call('ZREMRANGEBYSCORE', APPLIED, '-inf', now)
  end
  return false
end

-- Run a script body; a foreign value at one of our keys becomes a WRONGTYPE reply.
local function run(body)
  local ok, result = pcall(body)
  if ok then
    return result
  end
  return (caught(result, EXPECTED))
end

---------------------------------------------------------------------------------------
