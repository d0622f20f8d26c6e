-- permit_prelude: shared by every permit_*.lua script; joined in front of each one at
-- compile time, so every script sees the same KEYS layout and helpers.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 count    STRING available permits, may be negative, within +-(2^53 - 1); absent until
--                     first set or added. Never expires.
--   2 queue    ZSET   waiting request id -> ticket (arrival order)
--   3 waiters  ZSET   request id -> waiter-lease end, ms of Redis time: requests waiting, and
--                     requests granted while they waited that have not collected the grant
--   4 records  HASH   r:<id> a request: "w|k|since|channel" waiting, "g|k" granted (not
--                     collected), "c|k" collected, "x" withdrawn, "d|n" a drain that took n
--                     (k permits); and the fields read with them: keep (ms until which every
--                     key but the count is kept once idle), live ("1" while anyone waits or a
--                     grant is uncollected), prune (when to forget remembered ids next), wlen
--                     (size of waiters), wnext (no waiter lease ends before it), qlen (size of
--                     queue)
--   5 meta     HASH   seq (ticket counter)
--   6 applied  ZSET   r:<id> of requests settled ("c", "x", "d") and m:<id> of mutations
--                     applied (add, release, try_set) -> forget-at, ms of Redis time:
--                     remembered at least REMEMBER_MS, so that a call repeated with the same id
--                     is applied once
--
-- Expiry: while anyone waits (live), no key carries a TTL, so no volatile-* eviction policy
-- can pick one. Once idle, keys 2-6 (remembered ids, the ticket counter) expire an idle
-- minute after the latest forget-at; the count never does.
--
-- Failures: a script validates before its first write (a foreign value is found at the first
-- access of its key; run() then saves what was settled before and answers WRONGTYPE), writes
-- the records back in slices, and publishes wake-ups only after everything is saved, with
-- redis.pcall: a refused PUBLISH (an ACL without channel rights) costs the waiter one timer
-- re-check, never a half-written state.
--
-- Work per call is bounded whatever the numbers given: at most MAX_STEPS queue heads are
-- granted or dropped per call (the next one in line is then woken, and its own poll admits
-- the next ones), at most 1000 expired waiters dropped and 256 ids forgotten.
--
-- Lost state: if records vanish while the queue or waiters remain, qlen and wlen are rebuilt
-- from them (entries without a record are dropped); a waiter whose record or queue entry
-- vanished is told GONE and queues again. Nothing is granted that the count does not hold.
--
-- Cost: every redis.call costs about a microsecond, more than most commands themselves, and
-- Lua builds every helper below again on each call, so there are few of both. A script
-- reads the fields of records once (HMGET), changes them in Lua (set), and writes them back
-- with one HSET/HDEL, and the count with one INCRBY, at the end. The bookkeeping keys'
-- lives are extended about twice a minute while idle, not on every call.
local COUNT, QUEUE, WAITERS, RECORDS, META, APPLIED

-- How long an applied id is remembered at least (a retry comes within seconds).
local REMEMBER_MS = 60000
-- Forgetting is batched: an id is forgotten up to this much later than REMEMBER_MS.
local PRUNE_EVERY_MS = 10000
-- Redis scripts count in doubles: counts stay within +-(2^53 - 1).
local MAX_ABS = 9007199254740991
-- Queue heads granted (or dropped) per call at most; the rest are admitted by later calls.
local MAX_STEPS = 100

-- S: the time (now), the fields of records read or changed, the count (nil if absent), the
-- permits taken by this call (taken, written back as one INCRBY), the latest deadline this
-- call set (need: keep must cover it), the keys it created (fresh_*: they get keep), the
-- queue heads promote() handled (steps), and the wake-ups to publish at the end (wake).
-- dirty: the fields of records to write back (a value, or false to delete).
local S, dirty

-- Start a call: its keys and a fresh per-call state. (Loaded as a function library, this
-- file's helpers outlive a call: nothing of one call may leak into the next.)
local function begin(keys)
  COUNT, QUEUE, WAITERS, RECORDS, META, APPLIED = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6]
  S, dirty = { taken = 0, need = 0, steps = 0, wake = {} }, {}
end


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
  if count and (not string.match(count, '^-?%d+$') or math.abs(tonumber(count)) > MAX_ABS) then
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
-- and wake exactly those (one message each on their client's channel, sent by run() once
-- the state is saved). Stops at the first waiter that does not fit, so a large request is
-- never overtaken by smaller ones behind it, and after MAX_STEPS heads: then the next head
-- that fits is woken without a grant, and its poll admits the next ones. Entries without a
-- record (lost) are dropped. A granted waiter keeps its waiter lease until it collects.
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
    if S.steps >= MAX_STEPS then
      if st == 'w' then
        S.wake[#S.wake + 1] = { channel, head }
      end
      return
    end
    S.steps = S.steps + 1
    redis.call('ZREM', QUEUE, head)
    set('qlen', S.qlen - 1)
    if st == 'w' then
      add(-k)
      set(name, 'g|' .. digits)
      S.wake[#S.wake + 1] = { channel, head }
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
    local position = call(QUEUE, 'ZRANK', QUEUE, id)
    if not position then
      -- Its place in the queue is lost (the queue vanished): it queues again.
      set('wlen', math.max(S.wlen - call(WAITERS, 'ZREM', WAITERS, id), 0))
      set(name, false)
      return { 'GONE' }
    end
    local deadline = S.now + lease
    -- (Not XX: a waiters entry that vanished is put back.)
    if call(WAITERS, 'ZADD', WAITERS, deadline, id) == 1 then
      set('wlen', S.wlen + 1)
    end
    if not S.wnext or deadline < S.wnext then
      set('wnext', deadline)
    end
    if deadline > S.need then
      S.need = deadline
    end
    return { 'QUEUED', position, math.max(math.floor(lease / 3), 1) }
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
-- After it: save, then publish the wake-ups. While anyone waits, no key has a TTL (a key
-- that had one loses it when the first waiter comes). Once idle, keep every bookkeeping key
-- until an idle minute after the latest deadline (`keep`): when a new deadline comes within
-- half a minute of keep, keep moves and every key gets it (PEXPIREAT); a key created by this
-- call gets the current keep.
local function run(body, name, mode)
  if mode == 'bare' then
    local ok, result = pcall(body)
    if ok then
      return result
    end
    return (caught(result, {
      [COUNT] = 'integer', [QUEUE] = 'zset', [WAITERS] = 'zset', [RECORDS] = 'hash', [META] = 'hash', [APPLIED] = 'zset',
    }))
  end
  local ok, result = pcall(function()
    local t = redis.call('TIME')
    local now = t[1] * 1000 + math.floor(t[2] / 1000)
    S.now = now
    local r = call(RECORDS, 'HMGET', RECORDS, 'keep', 'prune', 'wlen', 'wnext', 'qlen', 'live', name or 'keep')
    -- (Absent fields are false; most calls find wlen and qlen absent or "0".)
    S.keep, S.prune = tonumber(r[1]) or 0, tonumber(r[2])
    S.wlen = r[3] and r[3] ~= '0' and tonumber(r[3]) or 0
    S.qlen = r[5] and r[5] ~= '0' and tonumber(r[5]) or 0
    S.wnext = r[4] and tonumber(r[4])
    S.live = r[6]
    if name then
      S[name] = r[7]
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
      local queued = call(QUEUE, 'ZCARD', QUEUE)
      local waiting = call(WAITERS, 'ZCARD', WAITERS)
      call(META, 'HLEN', META)
      call(APPLIED, 'ZCARD', APPLIED)
      if queued == 0 and waiting == 0 then
        return body()
      end
      -- The records vanished and the queue did not (lost state): rebuild the counters from
      -- the queue and waiters; promote drops the entries that have no record.
      set('qlen', queued)
      set('wlen', waiting)
      S.wnext = now
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
    if not foreign or not S.wlen then
      -- (Found before the records were read: nothing to save.)
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
  local expire_records = false
  if S.wlen > 0 or S.qlen > 0 then
    -- Live: nothing may expire (keep still marks that there is bookkeeping).
    if not S.live then
      set('live', '1')
      for _, key in ipairs({ QUEUE, WAITERS, RECORDS, META, APPLIED }) do
        redis.call('PERSIST', key)
      end
    end
    if need + 30000 > S.keep then
      set('keep', need + 60000)
    end
  elseif S.live then
    -- The last waiter left: idle from now on, kept an idle minute after every forget-at.
    set('live', false)
    set('keep', math.max(need, S.now + REMEMBER_MS) + 60000)
    for _, key in ipairs({ QUEUE, WAITERS, META, APPLIED }) do
      redis.call('PEXPIREAT', key, S.keep)
    end
    expire_records = true
  elseif need > 0 and need + 30000 > S.keep then
    set('keep', need + 60000)
    for _, key in ipairs({ QUEUE, WAITERS, META, APPLIED }) do
      redis.call('PEXPIREAT', key, S.keep)
    end
    expire_records = true
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
  if expire_records then
    -- After the HSET: records may have been created just now.
    redis.call('PEXPIREAT', RECORDS, S.keep)
  end
  for i = 1, #gone, 1000 do
    redis.call('HDEL', RECORDS, unpack(gone, i, math.min(i + 999, #gone)))
  end
  -- Last, once everything is saved; a refused PUBLISH changes nothing.
  for _, wake in ipairs(S.wake) do
    redis.pcall('PUBLISH', wake[1], wake[2])
  end
  return reply
end

---------------------------------------------------------------------------------------
