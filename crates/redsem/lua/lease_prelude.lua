-- lease_prelude: shared by every lease_*.lua script; joined in front of each one at
-- compile time, so every script sees the same KEYS layout and helpers.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 holders  ZSET   permit id -> lease end, ms of Redis time
--   2 queue    ZSET   waiter id -> ticket (arrival order)
--   3 waiters  ZSET   waiter id -> waiter-lease end, ms of Redis time
--   4 records  HASH   id -> JSON record: holder {t token, s slots, k units, l label, a granted at}
--                                        waiter {k units, l label, c wake channel, w waiting since}
--   5 meta     HASH   cap, used (units held), hwm (slot high-water mark), seq (ticket counter),
--                     label:<label> (live holders + waiters with that label)
--   6 free     ZSET   free slot numbers below the high-water mark (score = slot)
--   7 token    STRING fencing-token counter; the only key that never expires
local HOLDERS, QUEUE, WAITERS, RECORDS, META, FREE, TOKEN =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]

-- How long the keys of an idle semaphore outlive its last lease.
local KEEP_IDLE_MS = 3600000

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A key of ours holding a foreign type is reported, never overwritten.
local function foreign_key()
  local expected = {
    { HOLDERS, 'zset' }, { QUEUE, 'zset' }, { WAITERS, 'zset' }, { RECORDS, 'hash' },
    { META, 'hash' }, { FREE, 'zset' }, { TOKEN, 'string' },
  }
  for _, e in ipairs(expected) do
    local actual = redis.call('TYPE', e[1])['ok']
    if actual ~= 'none' and actual ~= e[2] then
      return { 'WRONGTYPE', e[1], actual, e[2] }
    end
  end
  local token = redis.call('GET', TOKEN)
  if token and not tonumber(token) then
    return { 'WRONGTYPE', TOKEN, 'string', 'integer' }
  end
  return nil
end

local function meta_num(field)
  return tonumber(redis.call('HGET', META, field) or '0') or 0
end

local function stored_cap()
  return tonumber(redis.call('HGET', META, 'cap') or '')
end

local function label_add(label, delta)
  if label ~= '' then
    local n = redis.call('HINCRBY', META, 'label:' .. label, delta)
    if n <= 0 then
      redis.call('HDEL', META, 'label:' .. label)
    end
  end
end

-- Lowest free slots first; a slot above every one handed out so far only when none is free.
local function take_slots(k)
  local slots = {}
  local hwm = meta_num('hwm')
  for i = 1, k do
    local popped = redis.call('ZPOPMIN', FREE)
    if popped[1] then
      slots[i] = tonumber(popped[1])
    else
      slots[i] = hwm
      hwm = hwm + 1
    end
  end
  redis.call('HSET', META, 'hwm', hwm)
  return slots
end

-- Slots at or above the capacity (left over from a shrink) are not reused.
local function give_slots(slots, cap)
  for _, s in ipairs(slots) do
    if s < cap then
      redis.call('ZADD', FREE, s, s)
    end
  end
end

local function grant(id, k, label, expires, now)
  local token = redis.call('INCR', TOKEN)
  local slots = take_slots(k)
  redis.call('ZADD', HOLDERS, expires, id)
  redis.call('HSET', RECORDS, id, cjson.encode({ t = token, s = slots, k = k, l = label, a = now }))
  redis.call('HINCRBY', META, 'used', k)
  return token, slots
end

local function drop_holder(id, cap)
  local raw = redis.call('HGET', RECORDS, id)
  redis.call('ZREM', HOLDERS, id)
  redis.call('HDEL', RECORDS, id)
  if raw then
    local r = cjson.decode(raw)
    give_slots(r.s, cap)
    redis.call('HINCRBY', META, 'used', -r.k)
    label_add(r.l, -1)
  end
end

local function drop_waiter(id)
  local raw = redis.call('HGET', RECORDS, id)
  redis.call('ZREM', QUEUE, id)
  redis.call('ZREM', WAITERS, id)
  redis.call('HDEL', RECORDS, id)
  if raw then
    label_add(cjson.decode(raw).l, -1)
  end
end

-- Grant, in arrival order, every waiter at the head of the queue that now fits, and wake
-- exactly those (one message each on their client's channel). Stops at the first waiter
-- that does not fit, so a large request is never overtaken by smaller ones behind it.
-- A waiter asking for more than the capacity is dropped and woken to learn it.
local function promote(now, cap)
  local used = meta_num('used')
  while true do
    local head = redis.call('ZRANGE', QUEUE, 0, 0)[1]
    if not head then
      return
    end
    local raw = redis.call('HGET', RECORDS, head)
    local w = raw and cjson.decode(raw)
    if not w or w.k > cap then
      drop_waiter(head)
      if w then
        redis.call('PUBLISH', w.c, head)
      end
    elseif used + w.k > cap then
      return
    else
      local expires = tonumber(redis.call('ZSCORE', WAITERS, head))
      redis.call('ZREM', QUEUE, head)
      redis.call('ZREM', WAITERS, head)
      grant(head, w.k, w.l, expires, now)
      used = used + w.k
      redis.call('PUBLISH', w.c, head)
    end
  end
end

-- Drop expired holders and waiters, then hand freed units to the queue.
local function settle(now, cap)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', HOLDERS, '-inf', now)) do
    drop_holder(id, cap)
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', WAITERS, '-inf', now)) do
    drop_waiter(id)
  end
  promote(now, cap)
end

-- Keep every expiring key alive until KEEP_IDLE_MS after the last lease it holds ends.
local function touch(now)
  local last = now
  local h = redis.call('ZRANGE', HOLDERS, -1, -1, 'WITHSCORES')
  if h[2] then
    last = math.max(last, tonumber(h[2]))
  end
  local w = redis.call('ZRANGE', WAITERS, -1, -1, 'WITHSCORES')
  if w[2] then
    last = math.max(last, tonumber(w[2]))
  end
  local ttl = last - now + KEEP_IDLE_MS
  for _, key in ipairs({ HOLDERS, QUEUE, WAITERS, RECORDS, META, FREE }) do
    redis.call('PEXPIRE', key, ttl)
  end
end

-- Rebuild the free-slot set for capacity `cap` from the live holders' slots.
local function rebuild_free(cap)
  redis.call('DEL', FREE)
  local ids = redis.call('ZRANGE', HOLDERS, 0, -1)
  if #ids == 0 then
    redis.call('HSET', META, 'hwm', 0)
    return
  end
  local held = {}
  for _, id in ipairs(ids) do
    local raw = redis.call('HGET', RECORDS, id)
    if raw then
      for _, s in ipairs(cjson.decode(raw).s) do
        held[s] = true
      end
    end
  end
  local batch = {}
  for s = 0, math.min(meta_num('hwm'), cap) - 1 do
    if not held[s] then
      batch[#batch + 1] = s
      batch[#batch + 1] = s
      if #batch >= 1000 then
        redis.call('ZADD', FREE, unpack(batch))
        batch = {}
      end
    end
  end
  if #batch > 0 then
    redis.call('ZADD', FREE, unpack(batch))
  end
end

-- When to look again without a wake-up: the head waiter also when the first lease ends.
local function recheck_ms(now, id, waiter_lease)
  local wait = math.floor(waiter_lease / 3)
  if redis.call('ZRANK', QUEUE, id) == 0 then
    local first = redis.call('ZRANGE', HOLDERS, 0, 0, 'WITHSCORES')
    if first[2] then
      wait = math.min(wait, tonumber(first[2]) - now + 1)
    end
  end
  return math.max(wait, 1)
end

---------------------------------------------------------------------------------------
