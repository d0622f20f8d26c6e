-- permit_prelude: shared by every permit_*.lua script; joined in front of each one at
-- compile time, so every script sees the same KEYS layout and helpers.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 count    STRING available permits, may be negative; absent until first set or added.
--                     The only key that never expires.
--   2 queue    ZSET   waiting request id -> ticket (arrival order)
--   3 waiters  ZSET   request id -> waiter-lease end, ms of Redis time: requests waiting, and
--                     requests granted while they waited that have not collected the grant
--   4 records  HASH   request id -> JSON {s state, k permits, c wake channel, w waiting since}
--                     state "w" waiting, "g" granted (not collected), "c" collected,
--                     "x" withdrawn
--   5 meta     HASH   seq (ticket counter)
--   6 applied  ZSET   id -> forget-at, ms of Redis time: mutations applied (add, release,
--                     try_set) and requests settled ("c", "x"), remembered for REMEMBER_MS so
--                     that a call repeated with the same id is applied once
local COUNT, QUEUE, WAITERS, RECORDS, META, APPLIED = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

-- How long an applied id is remembered (a retry comes within seconds).
local REMEMBER_MS = 60000
-- How long the bookkeeping keys outlive the last waiter lease and remembered id.
local KEEP_IDLE_MS = 60000
-- Redis scripts count in doubles: counts stay within +-(2^53 - 1).
local MAX_ABS = 9007199254740991

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A key of ours holding a foreign type is reported, never overwritten.
local function foreign_key()
  local expected = {
    { COUNT, 'string' }, { QUEUE, 'zset' }, { WAITERS, 'zset' }, { RECORDS, 'hash' },
    { META, 'hash' }, { APPLIED, 'zset' },
  }
  for _, e in ipairs(expected) do
    local actual = redis.call('TYPE', e[1])['ok']
    if actual ~= 'none' and actual ~= e[2] then
      return { 'WRONGTYPE', e[1], actual, e[2] }
    end
  end
  local count = redis.call('GET', COUNT)
  if count and not string.match(count, '^-?%d+$') then
    return { 'WRONGTYPE', COUNT, 'string', 'integer' }
  end
  return nil
end

local function available()
  return tonumber(redis.call('GET', COUNT) or '0')
end

-- Remember `id` (and its record, if any) until REMEMBER_MS from now.
local function remember(id, record, now)
  if record then
    redis.call('HSET', RECORDS, id, cjson.encode(record))
  end
  redis.call('ZADD', APPLIED, now + REMEMBER_MS, id)
end

-- Hand permits, in arrival order, to every waiter at the head of the queue that now fits,
-- and wake exactly those (one message each on their client's channel). Stops at the first
-- waiter that does not fit, so a large request is never overtaken by smaller ones behind it.
-- A granted waiter keeps its waiter lease until it collects the grant.
local function promote()
  local count = available()
  while true do
    local head = redis.call('ZRANGE', QUEUE, 0, 0)[1]
    if not head then
      return
    end
    local raw = redis.call('HGET', RECORDS, head)
    local w = raw and cjson.decode(raw)
    if not w or w.s ~= 'w' then
      redis.call('ZREM', QUEUE, head)
    elseif w.k > count then
      return
    else
      count = redis.call('DECRBY', COUNT, w.k)
      redis.call('ZREM', QUEUE, head)
      w.s = 'g'
      redis.call('HSET', RECORDS, head, cjson.encode(w))
      redis.call('PUBLISH', w.c, head)
    end
  end
end

-- Forget ids remembered long enough, drop waiters whose lease ended (giving back what was
-- granted to them and never collected), then hand what is available to the queue.
local function settle(now)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', APPLIED, '-inf', now, 'LIMIT', 0, 256)) do
    redis.call('ZREM', APPLIED, id)
    redis.call('HDEL', RECORDS, id)
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', WAITERS, '-inf', now)) do
    local raw = redis.call('HGET', RECORDS, id)
    redis.call('ZREM', QUEUE, id)
    redis.call('ZREM', WAITERS, id)
    redis.call('HDEL', RECORDS, id)
    if raw then
      local w = cjson.decode(raw)
      if w.s == 'g' then
        redis.call('INCRBY', COUNT, w.k)
      end
    end
  end
  promote()
end

-- Keep the bookkeeping keys alive until KEEP_IDLE_MS after the last waiter lease and the
-- last remembered id end.
local function touch(now)
  local last = now
  for _, key in ipairs({ WAITERS, APPLIED }) do
    local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if top[2] then
      last = math.max(last, tonumber(top[2]))
    end
  end
  local ttl = last - now + KEEP_IDLE_MS
  for _, key in ipairs({ QUEUE, WAITERS, RECORDS, META, APPLIED }) do
    redis.call('PEXPIRE', key, ttl)
  end
end

local function recheck_ms(waiter_lease)
  return math.max(math.floor(waiter_lease / 3), 1)
end

-- A request that already has a record checks in: collect a grant, renew a wait, or learn
-- that it was withdrawn.
local function check_in(id, w, now, waiter_lease)
  if w.s == 'c' then
    return { 'GRANTED' }
  end
  if w.s == 'g' then
    redis.call('ZREM', WAITERS, id)
    remember(id, { s = 'c', k = w.k }, now)
    touch(now)
    return { 'GRANTED' }
  end
  if w.s == 'w' then
    redis.call('ZADD', WAITERS, 'XX', now + waiter_lease, id)
    touch(now)
    return { 'QUEUED', redis.call('ZRANK', QUEUE, id), recheck_ms(waiter_lease) }
  end
  return { 'GONE' }
end

---------------------------------------------------------------------------------------
