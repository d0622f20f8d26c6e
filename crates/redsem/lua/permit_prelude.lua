-- permit_prelude: shared by every permit_*.lua script; joined in front of each one at
-- compile time, so every script sees the same KEYS layout and helpers.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 count    STRING available permits, may be negative; absent until first set or added.
--                     The only key that never expires.
--   2 queue    ZSET   waiting request id -> ticket (arrival order)
--   3 waiters  ZSET   request id -> waiter-lease end, ms of Redis time: requests waiting, and
--                     requests granted while they waited that have not collected the grant
--   4 records  HASH   r:<id> a request: "w|k|since|channel" waiting, "g|k" granted (not
--                     collected), "c|k" collected, "x" withdrawn (k permits); and the fields
--                     read with them: keep (ms until which every key but the count is kept),
--                     prune (when to forget remembered ids next), wlen (size of waiters),
--                     wnext (no waiter lease ends before it), qlen (size of queue)
--   5 meta     HASH   seq (ticket counter)
--   6 applied  ZSET   r:<id> of requests settled ("c", "x") and m:<id> of mutations applied
--                     (add, release, try_set) -> forget-at, ms of Redis time: remembered at
--                     least REMEMBER_MS, so that a call repeated with the same id is applied
--                     once
--
-- Cost: every redis.call costs about a microsecond, more than most commands themselves, and
-- Lua builds every helper below again on each call, so there are few of both. A script
-- reads the fields of records once (HMGET), changes them in Lua (set), and writes them back
-- with one HSET/HDEL, and the count with one INCRBY, at the end. The bookkeeping keys'
-- lives are extended about twice a minute, not on every call. Key types are checked for
-- free: every command on a key goes through call(), and a failing first access of a key (a
-- foreign type) aborts the script before that key is written; run() then saves what was
-- settled so far and answers WRONGTYPE.
local COUNT, QUEUE, WAITERS, RECORDS, META, APPLIED = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

-- How long an applied id is remembered at least (a retry comes within seconds).
local REMEMBER_MS = 60000
-- Forgetting is batched: an id is forgotten up to this much later than REMEMBER_MS.
local PRUNE_EVERY_MS = 10000
-- Redis scripts count in doubles: counts stay within +-(2^53 - 1).
local MAX_ABS = 9007199254740991

-- S: the time (now), the fields of records read or changed, the count (nil if absent), the
-- permits taken by this call (taken, written back as one INCRBY), the latest deadline this
-- call set (need: keep must cover it), and the keys it created (fresh_*: they get keep).
-- dirty: the fields of records to write back (a value, or false to delete).
local S, dirty = { taken = 0, need = 0 }, {}


local function set(name, value)
  S[name] = value
  dirty[name] = value
end

-- A record's state, permits (a number, and as written) and wake channel.
local function parse(raw)
  if not raw then
    return nil, 0
  end
  local st, k, channel = string.match(raw, '^(%a)|?(%d*)|?%d*|?(.*)$')
  return st, tonumber(k) or 0, channel, k
end

-- Remember `name` (r:<id> or m:<id>) for REMEMBER_MS from now. With `once`, a name
-- remembered already is left as it is, and the answer is false.
local function remember(name, once)
  local forget = S.now + REMEMBER_MS
  if not once then
    call(APPLIED, 'ZADD', APPLIED, forget, name)
  elseif call(APPLIED, 'ZADD', APPLIED, 'NX', forget, name) == 0 then
    if tonumber(redis.call('ZSCORE', APPLIED, name)) > S.now then
      return false
    end
    -- Past its time, but not forgotten yet.
    redis.call('ZADD', APPLIED, forget, name)
  end
  if not S.prune then
    S.fresh_applied = true
    set('prune', forget + PRUNE_EVERY_MS)
  end
  if forget > S.need then
    S.need = forget
  end
  return true
end

-- Read the count (nil if absent).
local function read_count()
  local count = call(COUNT, 'GET', COUNT)
  if count and not string.match(count, '^-?%d+$') then
    error({ key = COUNT })
  end
  S.count, S.unread = tonumber(count), false
  return S.count
end

-- Change the count by `delta` (the count is created if absent, as INCRBY would).
local function add(delta)
  S.create_count = S.create_count or not S.count
  S.count = (S.count or 0) + delta
  S.taken = S.taken - delta
end

-- Hand permits, in arrival order, to every waiter at the head of the queue that now fits,
-- and wake exactly those (one message each on their client's channel). Stops at the first
-- waiter that does not fit, so a large request is never overtaken by smaller ones behind it.
-- A granted waiter keeps its waiter lease until it collects the grant.
local function promote()
  while S.qlen > 0 do
    local head = call(QUEUE, 'ZRANGE', QUEUE, 0, 0)[1]
    if not head then
      set('qlen', 0)
      return
    end
    local name = 'r:' .. head
    if S[name] == nil then
      S[name] = redis.call('HGET', RECORDS, name)
    end
    local st, k, channel, digits = parse(S[name])
    if st == 'w' and k > (S.count or 0) then
      return
    end
    redis.call('ZREM', QUEUE, head)
    set('qlen', S.qlen - 1)
    if st == 'w' then
      add(-k)
      set(name, 'g|' .. digits)
      redis.call('PUBLISH', channel, head)
    end
  end
end

-- A request that already has a record checks in: collect a grant, renew a wait, or learn
-- that it was withdrawn.
local function check_in(id, lease)
  local name = 'r:' .. id
  local st = parse(S[name])
  if st == 'g' then
    remember(name)
    set('wlen', math.max(S.wlen - call(WAITERS, 'ZREM', WAITERS, id), 0))
    set(name, 'c' .. string.sub(S[name], 2))
  elseif st == 'w' then
    local deadline = S.now + lease
    call(WAITERS, 'ZADD', WAITERS, 'XX', deadline, id)
    if not S.wnext or deadline < S.wnext then
      set('wnext', deadline)
    end
    if deadline > S.need then
      S.need = deadline
    end
    return { 'QUEUED', call(QUEUE, 'ZRANK', QUEUE, id), math.max(math.floor(lease / 3), 1) }
  elseif st ~= 'c' then
    return { 'GONE' }
  end
  return { 'GRANTED' }
end

-- Run a script body and write back what it changed; a foreign value at one of our keys
-- becomes a WRONGTYPE reply (after saving what was settled before it was found).
--
-- Before the body (unless `mode` is "bare"): read the time, the fields of records (and the
-- field `name`, if given) and the count (with mode "lazy", only if this needs it: else
-- S.unread is set); then forget ids remembered long enough, drop waiters whose lease ended
-- (giving back what was granted to them and never collected), and hand what is available
-- to the queue.
--
-- After it: keep every bookkeeping key alive until an idle minute after the latest
-- deadline (`keep`): when a new deadline comes within half a minute of keep, keep moves
-- and every key gets it (PEXPIREAT); a key created by this call gets the current keep.
local function run(body, name, mode)
  local ok, result = pcall(function()
    if mode == 'bare' then
      return body()
    end
    local t = redis.call('TIME')
    local now = t[1] * 1000 + math.floor(t[2] / 1000)
    S.now = now
    local r = call(RECORDS, 'HMGET', RECORDS, 'keep', 'prune', 'wlen', 'wnext', 'qlen', name or 'keep')
    -- (Absent fields are false; most calls find wlen and qlen absent or "0".)
    S.keep, S.prune = tonumber(r[1]) or 0, tonumber(r[2])
    S.wlen = r[3] and r[3] ~= '0' and tonumber(r[3]) or 0
    S.qlen = r[5] and r[5] ~= '0' and tonumber(r[5]) or 0
    S.wnext = r[4] and tonumber(r[4])
    if name then
      S[name] = r[6]
    end
    if mode ~= 'lazy' or S.keep == 0 or S.qlen > 0 or (S.wlen > 0 and now >= (S.wnext or 0)) then
      read_count()
    else
      S.unread = true
    end

    if S.keep == 0 then
      -- No bookkeeping: check every other key once (rare, so the cost does not matter), so
      -- that nothing is written next to a foreign value. Later calls find a foreign value
      -- at its first access instead.
      call(QUEUE, 'ZCARD', QUEUE)
      call(WAITERS, 'ZCARD', WAITERS)
      call(META, 'HLEN', META)
      call(APPLIED, 'ZCARD', APPLIED)
      return body()
    end

    if S.prune and now >= S.prune then
      local batch = 256
      local due = call(APPLIED, 'ZRANGEBYSCORE', APPLIED, '-inf', now, 'LIMIT', 0, batch)
      if #due > 0 then
        redis.call('ZREMRANGEBYRANK', APPLIED, 0, #due - 1)
        for _, remembered in ipairs(due) do
          if string.sub(remembered, 1, 2) == 'r:' then
            set(remembered, false)
          end
        end
      end
      if #due == batch then
        set('prune', now)
      else
        local first = redis.call('ZRANGE', APPLIED, 0, 0, 'WITHSCORES')[2]
        set('prune', first and tonumber(first) + PRUNE_EVERY_MS or false)
      end
    end

    if S.wlen > 0 and now >= (S.wnext or 0) then
      local batch = 1000
      local ids = call(WAITERS, 'ZRANGEBYSCORE', WAITERS, '-inf', now, 'LIMIT', 0, batch)
      if #ids > 0 then
        redis.call('ZREMRANGEBYRANK', WAITERS, 0, #ids - 1)
        local names, queued = {}, {}
        for i, id in ipairs(ids) do
          names[i] = 'r:' .. id
        end
        local raws = redis.call('HMGET', RECORDS, unpack(names))
        for i, id in ipairs(ids) do
          local st, k = parse(raws[i])
          if st == 'w' then
            queued[#queued + 1] = id
          elseif st == 'g' then
            add(k)
          end
          set(names[i], false)
        end
        if #queued > 0 then
          set('qlen', math.max(S.qlen - call(QUEUE, 'ZREM', QUEUE, unpack(queued)), 0))
        end
        set('wlen', math.max(S.wlen - #ids, 0))
      end
      local first = S.wlen > 0 and redis.call('ZRANGE', WAITERS, 0, 0, 'WITHSCORES')[2]
      if #ids == batch then
        first = now -- more are due
      end
      set('wnext', first and tonumber(first) or false)
      if not first then
        set('wlen', 0)
      end
    end
    promote()
    return body()
  end)

  local reply = result
  if not ok then
    local foreign
    reply, foreign = caught(result, {
      [COUNT] = 'integer', [QUEUE] = 'zset', [WAITERS] = 'zset', [RECORDS] = 'hash', [META] = 'hash', [APPLIED] = 'zset',
    })
    if not foreign then
      return reply
    end
  end

  if S.taken ~= 0 or S.create_count then
    redis.call('INCRBY', COUNT, string.format('%d', -S.taken))
  end
  local need = S.need
  if need == 0 and S.keep == 0 and next(dirty) then
    need = S.now
  end
  if need > 0 and need + 30000 > S.keep then
    set('keep', need + 60000)
    for _, key in ipairs({ QUEUE, WAITERS, META, APPLIED }) do
      redis.call('PEXPIREAT', key, S.keep)
    end
  else
    if S.fresh_queue then
      redis.call('PEXPIREAT', QUEUE, S.keep)
    end
    if S.fresh_waiters then
      redis.call('PEXPIREAT', WAITERS, S.keep)
    end
    if S.fresh_meta then
      redis.call('PEXPIREAT', META, S.keep)
    end
    if S.fresh_applied then
      redis.call('PEXPIREAT', APPLIED, S.keep)
    end
  end
  local args, gone = {}, {}
  for field, value in pairs(dirty) do
    if value then
      args[#args + 1] = field
      args[#args + 1] = value
    else
      gone[#gone + 1] = field
    end
  end
  -- (In slices: unpack has a limit.)
  for i = 1, #args, 1000 do
    redis.call('HSET', RECORDS, unpack(args, i, math.min(i + 999, #args)))
  end
  if dirty.keep then
    -- After the HSET: records may have been created just now.
    redis.call('PEXPIREAT', RECORDS, S.keep)
  end
  for i = 1, #gone, 1000 do
    redis.call('HDEL', RECORDS, unpack(gone, i, math.min(i + 999, #gone)))
  end
  return reply
end

---------------------------------------------------------------------------------------
