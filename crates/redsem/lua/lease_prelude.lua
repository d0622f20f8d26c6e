-- lease_prelude: shared by every lease_*.lua script; joined in front of each one at
-- compile time, so every script sees the same KEYS layout and helpers.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 leases  ZSET    id -> lease end (ms of Redis time) of every holder and every waiter
--   2 queue   ZSET    waiter id -> ticket (arrival order)
--   3 state   HASH    cap, used (units held), qlen (waiters), seq (ticket counter),
--                     keep (ms until which every key here is kept alive),
--                     label:<label> (holders + waiters with that label),
--                     r:<id> record: holder "h|token|units|granted at|slot,slot|label"
--                                    waiter "w|units|since|len(channel)|channel label"
--   4 slots   STRING  bitmap: bit n set = slot n held
--   5 token   STRING  fencing-token counter; the only key that never expires
--
-- Cost: every redis.call costs about a microsecond, so a script reads the state fields once
-- (HMGET), changes them in Lua, and writes them back with one HSET/HDEL (save()). Key types
-- are checked for free: every command on a key goes through call(), and a failing first
-- access of a key (a foreign type) aborts the script before that key is written; run()
-- then saves what was settled so far and answers WRONGTYPE.
local LEASES, QUEUE, STATE, SLOTS, TOKEN = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

-- How long the keys of an idle semaphore outlive its last lease.
local KEEP_IDLE_MS = 3600000
-- Extend the keys' lives only when a lease ends closer than this to `keep`.
local KEEP_MARGIN_MS = 60000

local EXPECTED = { [LEASES] = 'zset', [QUEUE] = 'zset', [STATE] = 'hash', [SLOTS] = 'string', [TOKEN] = 'integer' }

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Cached state fields, and the ones to write back or delete.
local S = {}
local dirty = {}
local removed = {}

local function put(name, value)
  S[name] = value
  dirty[name] = true
  removed[name] = nil
end

local function del(name)
  S[name] = false
  dirty[name] = nil
  removed[name] = true
end

local function field(name)
  if S[name] == nil then
    S[name] = call(STATE, 'HGET', STATE, name)
  end
  return S[name]
end

local function save()
  local args = {}
  for name in pairs(dirty) do
    args[#args + 1] = name
    args[#args + 1] = S[name]
  end
  if #args > 0 then
    redis.call('HSET', STATE, unpack(args))
    if dirty.keep then
      -- After the HSET: the state may have been created just now.
      redis.call('PEXPIREAT', STATE, S.keep)
    end
  end
  local gone = {}
  for name in pairs(removed) do
    gone[#gone + 1] = name
  end
  if #gone > 0 then
    redis.call('HDEL', STATE, unpack(gone))
  end
  dirty, removed = {}, {}
end

-- Run a script body; a foreign value at one of our keys becomes a WRONGTYPE reply, after
-- saving what was settled before it was found.
local function run(body)
  local ok, result = pcall(body)
  if ok then
    return result
  end
  local reply, foreign = caught(result, EXPECTED)
  if foreign then
    save()
  end
  return reply
end

-- Read the state fields (and the record of `id`, if given).
local function load(id)
  local r = call(STATE, 'HMGET', STATE, 'cap', 'used', 'qlen', 'seq', 'keep', 'r:' .. (id or ''))
  S.cap, S.used, S.qlen = tonumber(r[1]), tonumber(r[2]) or 0, tonumber(r[3]) or 0
  S.seq, S.keep = tonumber(r[4]) or 0, tonumber(r[5]) or 0
  if id then
    S['r:' .. id] = r[6]
  end
  if not S.cap then
    -- No state: check every key once (rare, so the cost does not matter). Later scripts
    -- find a foreign value at its first access instead.
    call(LEASES, 'ZCARD', LEASES)
    call(QUEUE, 'ZCARD', QUEUE)
    local token = call(TOKEN, 'GET', TOKEN)
    if token and not tonumber(token) then
      error({ key = TOKEN })
    end
    if redis.call('EXISTS', SLOTS) == 1 then
      error({ key = SLOTS, expected = 'slot bitmap of a semaphore with state' })
    end
  end
end

-- Store a capacity. A semaphore without state starts with an empty slot bitmap, so the
-- bitmap exists (and expires) together with the state; a string already there is foreign.
local function set_cap(cap)
  if not S.cap then
    redis.call('SET', SLOTS, '\0')
  end
  put('cap', cap)
end

-- Keep every expiring key alive until KEEP_IDLE_MS after `lease_end`.
local function keep_alive(lease_end)
  if lease_end + KEEP_MARGIN_MS <= S.keep then
    return
  end
  local keep = lease_end + KEEP_IDLE_MS
  for _, key in ipairs({ LEASES, QUEUE, SLOTS }) do
    redis.call('PEXPIREAT', key, keep)
  end
  put('keep', keep) -- save() sets the state's own expiry
end

-- A zset that was empty (so absent) gets the keys' common expiry when re-created.
local function created(key)
  if S.keep > 0 then
    redis.call('PEXPIREAT', key, S.keep)
  end
end

local function label_add(label, delta)
  if label ~= '' then
    local name = 'label:' .. label
    local n = (tonumber(field(name)) or 0) + delta
    if n > 0 then
      put(name, n)
    else
      del(name)
    end
  end
end

local function holder_record(token, k, at, slots, label)
  return string.format('h|%d|%d|%d|%s|%s', token, k, at, table.concat(slots, ','), label)
end

local function waiter_record(k, since, channel, label)
  return string.format('w|%d|%d|%d|%s%s', k, since, #channel, channel, label)
end

-- The record of `id` as a table: {h = true, t, k, a, s, l} or {k, w, c, l}; nil if none.
local function record(id)
  local raw = field('r:' .. id)
  if not raw then
    return nil
  end
  local t, k, a, slots, label = string.match(raw, '^h|(%d+)|(%d+)|(%d+)|([%d,]*)|(.*)$')
  if t then
    local s = {}
    for n in string.gmatch(slots, '%d+') do
      s[#s + 1] = tonumber(n)
    end
    return { h = true, t = tonumber(t), k = tonumber(k), a = tonumber(a), s = s, l = label }
  end
  local wk, since, clen, rest = string.match(raw, '^w|(%d+)|(%d+)|(%d+)|(.*)$')
  if not wk then
    return nil
  end
  clen = tonumber(clen)
  return { k = tonumber(wk), w = tonumber(since), c = string.sub(rest, 1, clen), l = string.sub(rest, clen + 1) }
end

local function add_lease(id, expires)
  local was_empty = S.used == 0 and S.qlen == 0
  call(LEASES, 'ZADD', LEASES, expires, id)
  if was_empty then
    created(LEASES)
  end
end

-- Each unit takes the lowest free slot. Reads and the token come before any write.
local function grant(id, k, label, expires, now)
  local first = call(SLOTS, 'BITPOS', SLOTS, 0)
  local token = call(TOKEN, 'INCR', TOKEN)
  local slots = { first }
  redis.call('SETBIT', SLOTS, first, 1)
  for i = 2, k do
    slots[i] = redis.call('BITPOS', SLOTS, 0)
    redis.call('SETBIT', SLOTS, slots[i], 1)
  end
  add_lease(id, expires)
  put('r:' .. id, holder_record(token, k, now, slots, label))
  put('used', S.used + k)
  return token, slots
end

local function drop_holder(id, r)
  for _, s in ipairs(r.s) do
    call(SLOTS, 'SETBIT', SLOTS, s, 0)
  end
  redis.call('ZREM', LEASES, id)
  del('r:' .. id)
  put('used', S.used - r.k)
  label_add(r.l, -1)
end

local function drop_waiter(id, r)
  call(QUEUE, 'ZREM', QUEUE, id)
  redis.call('ZREM', LEASES, id)
  del('r:' .. id)
  put('qlen', S.qlen - 1)
  label_add(r.l, -1)
end

-- Grant, in arrival order, every waiter at the head of the queue that now fits, and wake
-- exactly those (one message each on their client's channel: "id|token|slot,slot"). The
-- grant's lease ends where the waiter's lease ended; the client renews it. Stops at the first waiter
-- that does not fit, so a large request is never overtaken by smaller ones behind it.
-- A waiter asking for more than the capacity is dropped and woken to learn it.
local function promote(now)
  while S.qlen > 0 do
    local head = call(QUEUE, 'ZRANGE', QUEUE, 0, 0)[1]
    if not head then
      put('qlen', 0)
      return
    end
    local w = record(head)
    if not w or w.h then
      redis.call('ZREM', QUEUE, head)
      put('qlen', S.qlen - 1)
    elseif w.k > S.cap then
      drop_waiter(head, w)
      redis.call('PUBLISH', w.c, head)
    elseif S.used + w.k > S.cap then
      return
    else
      local expires = tonumber(redis.call('ZSCORE', LEASES, head)) or now
      local token, slots = grant(head, w.k, w.l, expires, now)
      redis.call('ZREM', QUEUE, head)
      put('qlen', S.qlen - 1)
      -- The grant travels with the wake-up, so the waiter needs no round trip to collect it.
      redis.call('PUBLISH', w.c, string.format('%s|%d|%s', head, token, table.concat(slots, ',')))
    end
  end
end

-- Drop expired holders and waiters, then hand freed units to the queue.
local function settle(now)
  for _, id in ipairs(call(LEASES, 'ZRANGEBYSCORE', LEASES, '-inf', now)) do
    local r = record(id)
    if not r then
      redis.call('ZREM', LEASES, id)
    elseif r.h then
      drop_holder(id, r)
    else
      drop_waiter(id, r)
    end
  end
  promote(now)
end

-- When to look again without a wake-up: the head waiter also when the first lease ends.
local function recheck_ms(now, id, waiter_lease)
  local wait = math.floor(waiter_lease / 3)
  if redis.call('ZRANK', QUEUE, id) == 0 then
    local first = redis.call('ZRANGE', LEASES, 0, 0, 'WITHSCORES')
    if first[2] then
      wait = math.min(wait, tonumber(first[2]) - now + 1)
    end
  end
  return math.max(wait, 1)
end

---------------------------------------------------------------------------------------
