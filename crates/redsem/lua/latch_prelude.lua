-- latch_prelude: shared by every latch_*.lua script; joined in front of each one at compile
-- time, so every script sees the same KEYS layout and helpers.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 count    STRING the count, >= 1; absent when never set, opened (reached 0) or deleted.
--                     Never expires.
--   2 done     STRING "1" for DONE_MS after the count reached 0: tells "opened" from "never set"
--   3 applied  ZSET   request id -> forget-at, ms of Redis time: try_set and count_down calls
--                     applied, remembered for REMEMBER_MS so a repeated call is applied once
local COUNT, DONE, APPLIED = KEYS[1], KEYS[2], KEYS[3]

-- How long an applied id is remembered (a retry comes within seconds).
local REMEMBER_MS = 60000
-- How long an opened latch is reported as done rather than never set.
local DONE_MS = 3600000

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A key of ours holding a foreign type is reported, never overwritten.
local function foreign_key()
  local expected = { { COUNT, 'string' }, { DONE, 'string' }, { APPLIED, 'zset' } }
  for _, e in ipairs(expected) do
    local actual = redis.call('TYPE', e[1])['ok']
    if actual ~= 'none' and actual ~= e[2] then
      return { 'WRONGTYPE', e[1], actual, e[2] }
    end
  end
  local count = redis.call('GET', COUNT)
  if count and not string.match(count, '^%d+$') then
    return { 'WRONGTYPE', COUNT, 'string', 'integer' }
  end
  return nil
end

-- Forget ids remembered long enough; true if `id` is still remembered.
local function applied(id, now)
  redis.call('ZREMRANGEBYSCORE', APPLIED, '-inf', now)
  return redis.call('ZSCORE', APPLIED, id) ~= false
end

local function remember(id, now)
  redis.call('ZADD', APPLIED, now + REMEMBER_MS, id)
  redis.call('PEXPIRE', APPLIED, REMEMBER_MS)
end

---------------------------------------------------------------------------------------
