-- permit_prelude: the permit semaphore's keys, records and rules, after common.lua and in
-- front of every permit_*.lua operation, so every operation sees the same KEYS layout and
-- helpers.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 count    STRING available permits, may be negative, within +-(2^53 - 1); absent until
--                     first set or added. Never expires.
--   2 queue    ZSET   waiting request id -> ticket (arrival order)
--   3 waiters  ZSET   request id -> waiter-lease end, ms of Redis time: requests waiting, and
--                     requests granted while they waited that have not collected the grant
--   4 records  HASH   r:<id> a request: "w|k|since|channel" waiting, "g|k" granted (not
--                     collected) (k permits); s:<session> client session records (see
--                     common.lua) marking the calls in flight whose answers a resend must find:
--                     "G<k>" k permits taken (granted at once, or collected), "A" an addition
--                     applied, "D<n>" a drain that took n, "S" a count set, "X" a request
--                     withdrawn; and the fields read with them: layout ("2"), keep (ms until
--                     which every key but the count is kept once idle), live ("1" while anyone
--                     waits or a grant is uncollected), prune (when to drop expired session
--                     records next), wlen (size of waiters), wnext (no waiter lease ends before
--                     it), qlen (size of queue)
--   5 meta     HASH   seq (ticket counter)
--   6 sessions ZSET   s:<session> -> the expiry of that session's record, ms of Redis time
--
-- Layout 2 (client sessions; layout 1 remembered every request id for a minute): an idle
-- state of layout 1 is taken over (its records and remembered ids dropped, the count kept),
-- a live one refused ({"LAYOUT", key, found, ours}).
--
-- Expiry (keep-alive, see common.lua): while anyone waits (live), no key carries a TTL. Once
-- idle, keys 2-6 (session records, the ticket counter) expire KEEP_IDLE_MS after the latest
-- session expiry or deadline; the count never does.
--
-- Failures: a script validates before its first write (a foreign value is found at the first
-- access of its key; run() then saves what was settled before and answers WRONGTYPE).
--
-- Work per call is bounded whatever the numbers given: at most MAX_STEPS queue heads are
-- granted or dropped per call (the next one in line is then woken, and its own poll admits
-- the next ones), at most EXPIRE_BATCH expired waiters dropped and PRUNE_BATCH session records.
--
-- Lost state: if records vanish while the queue or waiters remain, qlen and wlen are rebuilt
-- from them (entries without a record are dropped); a waiter whose record or queue entry
-- vanished is told GONE and queues again. Nothing is granted that the count does not hold.
--
-- Cost: a call reads the fields of records once (HMGET), changes them in Lua (put), and
-- writes them back together, and the count with one INCRBY, at the end. The bookkeeping
-- keys' lives are extended about twice a minute while idle, not on every call.
local COUNT, QUEUE, WAITERS, RECORDS, META, APPLIED

-- Dropping expired session records is batched: one goes up to this much after its expiry.
local PRUNE_EVERY_MS = 10000
-- Session records dropped, and expired waiters dropped, per call at most.
local PRUNE_BATCH = 256
local EXPIRE_BATCH = 1000
-- Queue heads granted (or dropped) per call at most; the rest are admitted by later calls.
local MAX_STEPS = 100
-- Idle bookkeeping is kept this long after the latest session expiry or deadline; the deadline
-- moves when one comes within KEEP_MARGIN_MS of it.
local KEEP_IDLE_MS = 60000
local KEEP_MARGIN_MS = 30000
-- A field longer than a listpack may hold (hash-max-listpack-value, 64 bytes by default),
-- written in the records hash with its first write: Redis then keeps the hash as a hash
-- table, whose fields cost the same to read and write however many records it holds (a
-- listpack is scanned from its start on every access; see the lease prelude's WIDE).
local WIDE = '--------------------------------------------------------------------------------'
-- The layout of these keys and records, stored in records (field `layout`); see the top.
local LAYOUT = '2'

-- Per call, beside common's S: the count (nil if absent; unread: not read yet), the permits
-- taken by this call (taken, written back as one INCRBY; create_count: INCRBY even if 0),
-- the latest deadline this call set (need: keep must cover it), the keys it created
-- (fresh_*: they get keep), and the queue heads promote() handled (steps).

-- A record's state, permits (a number, and as written) and wake channel.
local function parse(raw)
  if not raw then
    return nil, 0
  end
  local st, k, channel = string.match(raw, '^(%a)|?(%d*)|?%d*|?(.*)$')
  return st, tonumber(k) or 0, channel, k
end

-- Mark the call numbered `seq` (text) `mark` in the caller's session record (see
-- common.lua); a new or renewed record's expiry goes to sessions, and keep covers it.
local function mark(seq, mark_text)
  local value, renewed = session_put(S.low, seq, mark_text)
  put(S.sess, value)
  if renewed then
    call(APPLIED, 'ZADD', APPLIED, digits(renewed), S.sess)
    S.fresh_applied = true
    if not S.prune then
      put('prune', renewed + PRUNE_EVERY_MS)
    end
    if renewed > S.need then
      S.need = renewed
    end
  end
end

-- The mark of the call numbered `seq` if it is one of permits taken ("G<k>"): k; else nil.
local G = 71 -- the byte of 'G'
local function taken_by(seq)
  local m = session_mark(seq)
  return m and byte(m, 1) == G and (tonumber(string.sub(m, 2)) or 0) or nil
end

-- Read the count (nil if absent).
local function read_count()
  S.count, S.unread = read_integer(COUNT), false
  return S.count
end

-- Change the count by `delta` (the count is created if absent, as INCRBY would).
local function add(delta)
  S.create_count = S.create_count or not S.count
  S.count = (S.count or 0) + delta
  S.taken = S.taken - delta
end

-- Hand permits, in arrival order, to every waiter at the head of the queue that now fits,
-- and wake exactly those (one message each on their client's channel, sent once the state
-- is saved). Stops at the first waiter that does not fit, so a large request is never
-- overtaken by smaller ones behind it, and after MAX_STEPS heads: then the next head that
-- fits is woken without a grant, and its poll admits the next ones. Entries without a
-- record (lost) are dropped. A granted waiter keeps its waiter lease until it collects.
local function promote()
  while S.qlen > 0 do
    local head = call(QUEUE, 'ZRANGE', QUEUE, '0', '0')[1]
    if not head then
      put('qlen', 0)
      return
    end
    local name = 'r:' .. head
    local st, k, channel, digits = parse(field(name))
    if st == 'w' and k > (S.count or 0) then
      return
    end
    if S.steps >= MAX_STEPS then
      if st == 'w' then
        wake(channel, head)
      end
      return
    end
    S.steps = S.steps + 1
    redis.call('ZREM', QUEUE, head)
    put('qlen', S.qlen - 1)
    if st == 'w' then
      add(-k)
      put(name, 'g|' .. digits)
      wake(channel, head)
    end
  end
end

-- Start or renew the waiter lease of `id`, `lease` ms from now (not ZADD XX: an entry that
-- vanished is put back), counted in records at once; the QUEUED reply at `position`.
local function queued(id, lease, position)
  local deadline = S.now + lease
  local added = call(WAITERS, 'ZADD', WAITERS, deadline, id)
  if S.wlen == 0 then
    S.fresh_waiters = true
  end
  if S.wlen == 0 or not S.wnext or deadline < S.wnext then
    put('wnext', deadline)
  end
  if added == 1 then
    put('wlen', S.wlen + 1)
  end
  S.need = math.max(S.need, deadline)
  return { 'QUEUED', position, math.max(math.floor(lease / 3), 1) }
end

-- A request checks in, by the call numbered `seq` (text): collect a grant (the record goes,
-- the call is marked with the permits taken, so that its resend answers GRANTED again), renew
-- a wait, or learn that it is gone.
local function check_in(id, lease, seq)
  local name = 'r:' .. id
  local st, _, _, k = parse(S[name])
  if st == 'g' then
    put('wlen', math.max(S.wlen - call(WAITERS, 'ZREM', WAITERS, id), 0))
    put(name, false)
    mark(seq, 'G' .. k)
  elseif st == 'w' then
    local position = call(QUEUE, 'ZRANK', QUEUE, id)
    if not position then
      -- Its place in the queue is lost (the queue vanished): it queues again.
      put('wlen', math.max(S.wlen - call(WAITERS, 'ZREM', WAITERS, id), 0))
      put(name, false)
      return { 'GONE' }
    end
    return queued(id, lease, position)
  elseif not (not session_stale(seq) and taken_by(seq)) then
    return { 'GONE' }
  end
  return { 'GRANTED' }
end

-- Read the time, the fields of records (and the field `name`, or each of the list `name`,
-- if given) and the count (with
-- mode "lazy", only if this call needs it: else S.unread is set). True if there is
-- bookkeeping to settle.
local function load(name, mode)
  local now = clock()
  -- (Read already if a fast path did not apply: `name` is then a string or nil.)
  local r = S.read
  if not r and type(name) == 'table' then
    -- (A batch: its requests' records, then the session's.)
    r = call(RECORDS, 'HMGET', RECORDS, 'keep', 'prune', 'wlen', 'wnext', 'qlen', 'live', 'wide', 'layout',
      unpack(name))
    for i, each in ipairs(name) do
      S[each] = r[8 + i]
    end
  elseif not r then
    r = call(RECORDS, 'HMGET', RECORDS, 'keep', 'prune', 'wlen', 'wnext', 'qlen', 'live', 'wide', 'layout',
      name or 'keep', S.sess or 's:')
    if S.sess then
      S[S.sess] = r[10]
    end
  end
  if r[8] ~= LAYOUT and (r[1] or r[7]) then
    -- Records of another layout. Layout 1, idle: taken over; else refused, untouched.
    if (r[8] or '1') ~= '1' or r[6] or (r[3] and r[3] ~= '0') or (r[5] and r[5] ~= '0') then
      error({ 'LAYOUT', RECORDS, r[8] or '1', LAYOUT })
    end
    call(APPLIED, 'ZCARD', APPLIED)
    redis.call('DEL', RECORDS, APPLIED)
    r, S.sl = {}, nil
    for each in pairs(S) do
      if type(each) == 'string' and (string.sub(each, 1, 2) == 'r:' or string.sub(each, 1, 2) == 's:') then
        S[each] = false
      end
    end
  end
  -- (Absent fields are false; most calls find wlen and qlen absent or "0".)
  S.keep, S.prune = tonumber(r[1]) or 0, tonumber(r[2])
  S.wlen = r[3] and r[3] ~= '0' and tonumber(r[3]) or 0
  S.qlen = r[5] and r[5] ~= '0' and tonumber(r[5]) or 0
  S.wnext = r[4] and tonumber(r[4])
  S.live, S.wide = r[6], r[7]
  S.loaded = true
  if type(name) == 'string' and S[name] == nil then
    S[name] = r[9] or false
  end
  -- (A fast path that did not apply may have read the count: S.unread is false then.)
  if S.unread == nil then
    if mode ~= 'lazy' or S.keep == 0 or S.qlen > 0 or (S.wlen > 0 and now >= (S.wnext or 0)) then
      read_count()
    else
      S.unread = true
    end
  end

  if S.keep == 0 then
    -- No bookkeeping: check every other key once (rare, so the cost does not matter), so
    -- that nothing is written next to a foreign value. Later calls find a foreign value
    -- at its first access instead.
    local queued = call(QUEUE, 'ZCARD', QUEUE)
    local waiting = call(WAITERS, 'ZCARD', WAITERS)
    call(META, 'HLEN', META)
    call(APPLIED, 'ZCARD', APPLIED)
    -- (Session records went with the records: their index goes too.)
    redis.call('DEL', APPLIED)
    if queued == 0 and waiting == 0 then
      return false
    end
    -- The records vanished and the queue did not (lost state): rebuild the counters from
    -- the queue and waiters; promote drops the entries that have no record.
    put('qlen', queued)
    put('wlen', waiting)
    S.wnext = now
  end
  return true
end

-- Drop expired session records, drop waiters whose lease ended (giving back what was
-- granted to them and never collected), and hand what is available to the queue.
local function settle()
  local now = S.now
  if S.prune and now >= S.prune then
    local due = call(APPLIED, 'ZRANGEBYSCORE', APPLIED, '-inf', now, 'LIMIT', 0, PRUNE_BATCH)
    if #due > 0 then
      redis.call('ZREMRANGEBYRANK', APPLIED, 0, #due - 1)
      for _, session in ipairs(due) do
        put(session, false)
      end
    end
    if #due == PRUNE_BATCH then
      put('prune', now)
    else
      local first = redis.call('ZRANGE', APPLIED, 0, 0, 'WITHSCORES')[2]
      put('prune', first and tonumber(first) + PRUNE_EVERY_MS or false)
    end
  end

  if S.wlen > 0 and now >= (S.wnext or 0) then
    local ids = call(WAITERS, 'ZRANGEBYSCORE', WAITERS, '-inf', now, 'LIMIT', 0, EXPIRE_BATCH)
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
        put(names[i], false)
      end
      if #queued > 0 then
        put('qlen', math.max(S.qlen - call(QUEUE, 'ZREM', QUEUE, unpack(queued)), 0))
      end
      put('wlen', math.max(S.wlen - #ids, 0))
    end
    local first = S.wlen > 0 and redis.call('ZRANGE', WAITERS, 0, 0, 'WITHSCORES')[2]
    if #ids == EXPIRE_BATCH then
      first = now -- more are due
    end
    put('wnext', first and tonumber(first) or false)
    if not first then
      put('wlen', 0)
    end
  end
  promote()
end

-- The count taken or given by this call (one INCRBY), then keep-alive: live, no key has a
-- TTL (a key that had one loses it when the first waiter comes). Once idle, every
-- bookkeeping key is kept until KEEP_IDLE_MS after the latest deadline (`keep`): when a new
-- deadline comes within KEEP_MARGIN_MS of keep, keep moves and every key gets it; a key
-- created by this call gets the current keep.
local function keep()
  if not S.wide and next(dirty) then
    put('wide', WIDE) -- (the hash is written: a hash table from now on)
    put('layout', LAYOUT)
  end
  if S.taken ~= 0 or S.create_count then
    redis.call('INCRBY', COUNT, string.format('%d', -S.taken))
  end
  local need = S.need
  if need == 0 and S.keep == 0 and next(dirty) then
    need = S.now
  end
  if S.wlen > 0 or S.qlen > 0 then
    -- Live: nothing may expire (keep still marks that there is bookkeeping).
    if not S.live then
      put('live', '1')
      persist({ QUEUE, WAITERS, META, APPLIED, RECORDS })
    end
    if need + KEEP_MARGIN_MS > S.keep then
      put('keep', need + KEEP_IDLE_MS)
    end
  elseif S.live then
    -- The last waiter left: idle from now on, kept an idle while after every session
    -- record's expiry (the latest one read from their index).
    local last = rpcall('ZRANGE', APPLIED, -1, -1, 'WITHSCORES')
    put('live', false)
    put('keep', math.max(need, S.now, type(last) == 'table' and tonumber(last[2]) or 0) + KEEP_IDLE_MS)
    expire_at(S.keep, { QUEUE, WAITERS, META, APPLIED, RECORDS })
  elseif need > 0 and need + KEEP_MARGIN_MS > S.keep then
    put('keep', need + KEEP_IDLE_MS)
    expire_at(S.keep, { QUEUE, WAITERS, META, APPLIED, RECORDS })
  elseif S.fresh_queue or S.fresh_waiters or S.fresh_meta or S.fresh_applied then
    -- (Tables only when a key was created: most calls create none.)
    local fresh = {}
    for key, created in pairs({ [QUEUE] = S.fresh_queue, [WAITERS] = S.fresh_waiters, [META] = S.fresh_meta,
      [APPLIED] = S.fresh_applied }) do
      if created then
        fresh[#fresh + 1] = key
      end
    end
    expire_at(S.keep, fresh)
  end
end

-- Start a call: its keys, a fresh per-call state and the hooks run() calls.
local HOOKS = { load = load, settle = settle, save = keep }
local function expected()
  return {
    [COUNT] = 'integer', [QUEUE] = 'zset', [WAITERS] = 'zset', [RECORDS] = 'hash', [META] = 'hash', [APPLIED] = 'zset',
  }
end
local function begin(keys)
  COUNT, QUEUE, WAITERS, RECORDS, META, APPLIED = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6]
  start(RECORDS, expected, HOOKS)
  S.taken, S.need, S.steps = 0, 0, 0
end

-- The operations that a group commit (permit_batch) applies one after another, and that
-- permit_acquire, permit_add and permit_withdraw apply alone.

-- A new request `id` for `digits` permits (as given), the call numbered `seq` (text) in the
-- caller's session: granted now if nobody waits and the count holds them (the call marked
-- with the permits taken), else (mode "wait") queued; a known id checks in instead, and a
-- call marked already answers as it did (a late copy of a withdrawn or answered one: GONE).
-- Each write is counted in records as soon as it is made, so a foreign value found at the
-- next key leaves nothing uncounted.
local function acquire_op(id, digits, mode, lease, channel, seq)
  local name = 'r:' .. id
  if session_stale(seq) then
    return { 'GONE' }
  end
  local m = session_mark(seq)
  if m then
    return byte(m, 1) == G and { 'GRANTED' } or { 'GONE' }
  elseif S[name] then
    return check_in(id, lease, seq)
  end
  local k = tonumber(digits)
  local count, position = S.count or 0, S.qlen
  if position == 0 and count >= k then
    add(-k)
    mark(seq, 'G' .. digits)
    return { 'GRANTED' }
  end
  if mode ~= 'wait' then
    return { 'BUSY', count, position }
  end
  local reply = queued(id, lease, position)
  local ticket = call(META, 'HINCRBY', META, 'seq', 1)
  S.fresh_meta = S.fresh_meta or ticket == 1
  call(QUEUE, 'ZADD', QUEUE, ticket, id)
  S.fresh_queue = S.fresh_queue or position == 0
  put('qlen', position + 1)
  put(name, string.format('w|%d|%d|%s', k, S.now, channel))
  return reply
end

-- Add `digits` (an integer as given, may be negative) to the count, once per call (the
-- call numbered `seq`, text, is marked), then hand what is available to the head of the
-- queue.
local function add_op(digits, seq)
  local delta = tonumber(digits)
  if session_stale(seq) or session_mark(seq) then
    if S.unread then
      read_count()
    end
    return { 'REPEATED', S.count or 0 }
  end
  if S.unread and math.abs(delta) <= MAX_INT then
    -- Nobody waits and no grant is given back: add first, look after.
    local count = call(COUNT, 'INCRBY', COUNT, digits)
    if math.abs(count) <= MAX_INT and math.abs(count - delta) <= MAX_INT then
      S.count, S.unread = count, false
      mark(seq, 'A')
      return { 'ADDED', count }
    end
    S.count, S.unread = redis.call('DECRBY', COUNT, digits), false
    if math.abs(S.count) > MAX_INT then
      error({ key = COUNT }) -- beyond +-MAX_INT before the call: not a count of ours
    end
  elseif S.unread then
    read_count()
  end
  local count = S.count or 0
  -- (An addition beyond +-MAX_INT, which the client never sends, is not exact as a double:
  -- refused, as a count it would leave.)
  if math.abs(delta) > MAX_INT or math.abs(count + delta) > MAX_INT then
    return { 'RANGE', count } -- (nothing changes, so the call is not marked)
  end
  add(delta)
  mark(seq, 'A')
  promote()
  return { 'ADDED', S.count }
end

-- The request `id` leaves: permits handed to it (collected or not: its caller never learned
-- of them) are given back. `seq` (text) is the number of the request's call that went
-- unanswered ("0" if none): its permits, if it took some (granted at once, or collected),
-- are given back too, and it is marked withdrawn, so a late copy of it is refused and the
-- withdrawal resent changes nothing.
local function withdraw_op(id, seq)
  local name = 'r:' .. id
  local st, k = parse(S[name])
  local result = { 'UNKNOWN' }
  if st == 'w' then
    put('qlen', math.max(S.qlen - call(QUEUE, 'ZREM', QUEUE, id), 0))
    result = { 'WITHDRAWN' }
  elseif st == 'g' then
    add(k)
    result = { 'RETURNED', k }
  elseif seq ~= '0' and not session_stale(seq) then
    local taken = taken_by(seq)
    if taken then
      add(taken)
      result = { 'RETURNED', taken }
    end
  end
  if st == 'w' or st == 'g' then
    put('wlen', math.max(S.wlen - call(WAITERS, 'ZREM', WAITERS, id), 0))
  end
  if st then
    put(name, false)
  end
  if seq ~= '0' then
    mark(seq, 'X')
  end
  promote()
  return result
end

---------------------------------------------------------------------------------------

-- The fast paths: the uncontended cycle, a grant with nobody waiting and the addition (a
-- release) with nobody waiting, written straight to the keys: no field cache, no settle, no
-- write-back. Each applies only where the general path (acquire_op, add_op) issues exactly
-- the same commands: the bookkeeping is in place (keep, wide, this layout), nobody waits and
-- no grant is uncollected (qlen, wlen 0, not live), no session record is due to be dropped
-- (prune ahead), the call is neither stale nor marked and its mark needs no renewal of the
-- session record. Otherwise it answers nil before its first write, and the general path runs
-- on the same read (load() takes S.read, and the count if read).

-- The time and the fields load() reads, with the field `name` and the caller's session
-- record (as load() reads them).
local function read_records(name)
  clock()
  local r = call(RECORDS, 'HMGET', RECORDS, 'keep', 'prune', 'wlen', 'wnext', 'qlen', 'live', 'wide', 'layout',
    name, S.sess)
  S.read = r
  S[S.sess] = r[10]
  return r
end

-- Whether the fields read (`r`) let a fast path run (see above).
local function quiet(r)
  if r[6] or not (r[1] and r[2] and r[7]) or r[8] ~= LAYOUT or (r[3] and r[3] ~= '0')
    or (r[5] and r[5] ~= '0') then
    return false
  end
  local prune = tonumber(r[2])
  return prune and S.now < prune
end

-- The caller's session record with the call numbered `seq` marked `mark`, unless the call is
-- stale or marked already, or the record needs renewing or keeps other marks (the general
-- path then): nil.
local function fast_mark(r, seq, mark_text)
  if r[10] and (session_stale(seq) or session_mark(seq)) then
    return nil
  end
  local value, renewed = session_put(S.low, seq, mark_text)
  if renewed or not value then
    S[S.sess], S.sl, S.smarks = r[10], nil, nil -- (read afresh by the general path)
    return nil
  end
  return value
end

-- permit_acquire of a new request that the count holds, with nobody waiting.
local function fast_acquire(A, name)
  local r = read_records(name)
  if r[9] or not quiet(r) then
    return nil
  end
  local k, count = tonumber(A[2]), read_count()
  if not (count and k) or count < k then
    return nil
  end
  local session = fast_mark(r, A[6], 'G' .. A[2])
  if not session then
    return nil
  end
  rcall('INCRBY', COUNT, '-' .. text(k))
  rcall('HSET', RECORDS, S.sess, session)
  return { 'GRANTED' }
end

-- permit_add of `delta` within +-MAX_INT, with nobody waiting (the count is not read: INCRBY
-- answers it).
local function fast_add(A)
  local r = read_records('keep')
  if not quiet(r) then
    return nil
  end
  local delta = tonumber(A[2])
  if not delta or math.abs(delta) > MAX_INT then
    return nil
  end
  local session = fast_mark(r, A[3], 'A')
  if not session then
    return nil
  end
  local count = call(COUNT, 'INCRBY', COUNT, A[2])
  if math.abs(count) <= MAX_INT and math.abs(count - delta) <= MAX_INT then
    rcall('HSET', RECORDS, S.sess, session)
    return { 'ADDED', count }
  end
  -- Out of range: taken back, and the call not marked (nothing changed). A count beyond
  -- +-MAX_INT before the call is not one of ours: reported as foreign, as a read reports it.
  count = redis.call('DECRBY', COUNT, A[2])
  if math.abs(count) > MAX_INT then
    error({ key = COUNT })
  end
  return { 'RANGE', count }
end
