-- latch_prelude: the latch's keys, records and rules, after common.lua and in front of every
-- latch_*.lua operation, so every operation sees the same KEYS layout and helpers.
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
-- Expiry (keep-alive, see common.lua): while the latch counts, no key has a TTL: applied is
-- pruned by the scripts. Once it opened or was deleted, done and applied are idle state and
-- expire.
--
-- Failures: every script reaches each key it may write with a read (or a write that cannot
-- harm) before it writes anything, so a foreign value aborts it before its first write, and
-- run() answers WRONGTYPE. A latch has no fields to load or settle: run() only catches
-- failures, gives TTLs and publishes "opened" last.
--
-- Cost: scripts make few calls, each O(1) or O(log n) but the occasional prune of ids past
-- their time.
local COUNT, DONE, APPLIED

-- How long an opened latch is reported as done rather than never set.
local DONE_MS = 3600000
-- Ids past their time are dropped on about one call in PRUNE_ONE_IN (by the time's low bits).
local PRUNE_ONE_IN = 16

-- The count (1 .. 2^53 - 1); nil if absent. A value that is not a count is foreign.
local function read_count()
  return read_integer(COUNT, true)
end

-- Remember `id` in applied (see remember_id()), unless it is remembered already: then false.
-- The first access of applied in the scripts that write. Sets no TTL: the caller does once
-- the latch stops counting.
local function remember(id)
  if not remember_id(APPLIED, id) then
    return false
  end
  if S.now % PRUNE_ONE_IN == 0 then
    redis.call('ZREMRANGEBYSCORE', APPLIED, '-inf', S.now)
  end
  return true
end

-- Start a call: its keys and a fresh per-call state (no hooks: nothing to load or settle).
local HOOKS = {}
local function expected()
  return { [COUNT] = 'integer', [DONE] = 'string', [APPLIED] = 'zset' }
end
local function begin(keys)
  COUNT, DONE, APPLIED = keys[1], keys[2], keys[3]
  start(nil, expected, HOOKS)
end

---------------------------------------------------------------------------------------
