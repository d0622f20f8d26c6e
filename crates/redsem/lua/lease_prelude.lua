---------------------------------------------------------------------------------------
-- lease_prelude: the lease semaphore's keys, records and rules, after common.lua and in front
-- of every lease_*.lua operation, so every operation sees the same KEYS layout and helpers.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 leases  ZSET    id -> ms of Redis time: the lease end of every holder and waiter
--                     (positive), and s:<session> -> minus the expiry of that client
--                     session's record (negative, so sessions never look due as leases)
--   2 queue   ZSET    waiter id -> ticket (arrival order)
--   3 state   HASH    cap, used (units held), nh (holders), qlen (waiters), nt (session
--                     records), seq (ticket counter), tok (last fencing token), idle (ms
--                     when the idle keys expire; 0 while they carry no TTL), next (no lease
--                     ends before it; 0 = unknown), tnext (the first session record's expiry;
--                     0 = none), label:<label> (holders + waiters with that label), and
--                     r:<id> records:
--                       holder    "h|token|units|granted at|lease|slots|label", slots as
--                                 runs "first-last,slot,..."
--                       waiter    "w|units|since|lease|waiter lease|len(channel)|channel label"
--                     s:<session> client sessions (see common.lua): a holder's release marks
--                     its sequence number with its outcome (R released, D withdrawn), so its
--                     resend answers as it did while any other release of the id, afterwards,
--                     answers NOTHELD; a withdrawal of a request whose enqueue went unanswered
--                     marks that enqueue's number X, so a late copy of it is refused (GONE)
--   4 slots   STRING  bitmap: bit n set = slot n held; deleted when the idle TTL is set
--
-- Failure rules every script keeps:
--   * Nothing live carries a TTL: while anyone holds or waits, no key has one, so no
--     `volatile-*` eviction can pick it. Only an idle semaphore's keys expire (KEEP_IDLE_MS).
--     A release that leaves the semaphore idle does not set the TTL itself (the next acquire
--     would remove it again: two commands each way on the hot path); it answers IDLE and the
--     client sends lease_tidy a moment later, which sets it if the semaphore is still idle.
--   * Every key is first touched by a read, or by a write that fails before changing it (a
--     foreign type, a missing ACL right), and the body writes nothing but through call();
--     run() saves what was settled before such a failure (see common.lua).
--   * The work of one script is bounded by MAX_UNITS, WORK_BUDGET and SETTLE_BATCH, never
--     by the numbers it is given.
--   * The counters (used, nh, qlen, nt), labels and the slot bitmap are rebuilt from the
--     records (repair()) when a cheap check finds them disagreeing.
--   * Fencing tokens are max(last token + 1, TIME in microseconds): they keep increasing
--     after the state is lost (restart without persistence, flush, failover, expiry) as long
--     as the server clock does not go back by more than the outage.
local LEASES, QUEUE, STATE, SLOTS

-- How long the keys of an idle semaphore are kept.
local KEEP_IDLE_MS = 3600000
-- Move the idle deadline only when it comes closer than this.
local KEEP_MARGIN_MS = 60000
-- The most units one request may take (the client checks this too).
local MAX_UNITS = 4096
-- Units one script may grant to or take from others (promote, settle), beyond its own
-- request: what is left over is done by the next script on this semaphore.
local WORK_BUDGET = 4096
-- Expired entries dropped by one script at most.
local SETTLE_BATCH = 256
-- Expired session records are dropped in batches, once the first is this late, at most this
-- many.
local PRUNE_LAG_MS = 2000
local PRUNE_BATCH = 4000
-- "No lease ends before": nothing is known to end (a double, exact).
local NEVER = 4503599627370496
-- The layout of the keys and records above, stored in the state hash (field `layout`) when
-- a state is made. A state that names another layout was written by a version of redsem
-- that keeps its state differently: every operation refuses it ({"LAYOUT", found, ours})
-- and changes nothing. A state without the field is of this layout (written before the
-- field existed): the first call names it (load()). Raise it with any change an older
-- version would misread; the upgrade is "drain, then upgrade" (README). Layout 2 (client
-- sessions in place of a minute of tombstones) adopts an idle state of layout 1 (nobody
-- holds or waits): its tombstones are dropped, the capacity and last token kept.
local LAYOUT = '2'
-- A field longer than a listpack may hold (hash-max-listpack-value, 64 bytes by default):
-- written in every state hash, it makes Redis keep that hash as a hash table. A small hash is
-- otherwise one list (a listpack, up to 128 or 512 fields), which every field read scans from
-- its start and every write rewrites: with the records of a few dozen holders and waiters
-- and a minute of remembered ids in it, those scans were the largest single cost of every call
-- (docs/BENCHMARKS.md, "Where the server time goes").
local WIDE = '--------------------------------------------------------------------------------'

-- Per call (see begin()), beside common's S: S.mine, the caller's wake channel, and
-- S.handed, the grants made to waiters on it (returned instead of published; nil if none); S.defer_idle:
-- leave the idle TTL to lease_tidy; the units left for others (WORK_BUDGET).
local budget

-- Nobody holds or waits, and the keys lack their idle TTL (or it ends soon).
local function needs_idle_ttl()
  return S.used == 0 and S.qlen == 0 and S.idle < S.now + KEEP_MARGIN_MS
end

-- Give the keys the TTL the state calls for (common's save() then writes the fields back).
-- A release defers the idle TTL to lease_tidy: S.defer_idle. A call that failed on a foreign
-- value (S.failed) leaves it as it found it, as the fast paths do.
local function keep()
  if not S.cap then
    return
  end
  if (S.used > 0 or S.qlen > 0) and S.idle > 0 then
    -- Live state carries no TTL. (The slot bitmap and the queue never get one.)
    persist({ STATE, LEASES })
    put('idle', 0)
  elseif needs_idle_ttl() and not S.defer_idle and not S.failed then
    put('idle', S.now + KEEP_IDLE_MS)
    expire_at(S.idle, { STATE, LEASES })
    -- The bitmap has no bit left: it goes (not a foreign value: BITCOUNT would fail).
    if redis.pcall('BITCOUNT', SLOTS) == 0 then
      redis.call('DEL', SLOTS)
    end
  end
end

-- Counts by their text, kept once converted: a look-up instead of a conversion (strtod costs
-- more than most commands). Only short texts (below 10^7: counters, capacities, slots, lease
-- times), which come back call after call; time stamps and tokens never repeat. Bounded: the
-- memo starts over when full. (A function library keeps it across calls, a script per call.)
local COUNTS, COUNTS_KEPT = {}, 0

local function count(value)
  local n = COUNTS[value]
  if n then
    return n
  end
  n = tonumber(value) -- (nil for false: an absent field)
  if n and n >= 0 and n == floor(n) then
    if n ~= value and #value < 8 then -- (a text, not a number)
      if COUNTS_KEPT == 4096 then
        COUNTS, COUNTS_KEPT = {}, 0
      end
      COUNTS[value], COUNTS_KEPT = n, COUNTS_KEPT + 1
    end
    return n
  elseif value == false or value == nil then
    return 0
  end
  error({ key = STATE, expected = 'hash of a semaphore (a count field is not a count)' })
end

-- tonumber(), from the memo when the text was read as a count before (a capacity, a lease
-- time given again and again).
local function number(value)
  return COUNTS[value] or tonumber(value)
end

local repair, adopt

-- Read the state fields (and the field `name`, the caller's record, if given, and the
-- caller's session record S.sess), and the time; true if there is a state to settle.
local function load(name)
  local r
  if type(name) == 'table' then
    -- A batch: the records of all its requests (the same id twice reads the same field),
    -- then the session's.
    r = call(STATE, 'HMGET', STATE, 'cap', 'used', 'qlen', 'seq', 'idle', 'tok', 'nh', 'nt', 'next',
      'tnext', 'layout', unpack(name))
    for i = 1, #name do
      S[name[i]] = r[11 + i]
    end
  else
    -- (Read already by a fast path whose case this is not: see read_state().)
    r = S.read or call(STATE, 'HMGET', STATE, 'cap', 'used', 'qlen', 'seq', 'idle', 'tok', 'nh', 'nt',
      'next', 'tnext', 'layout', name or 'r:', S.sess or 's:')
    if name then
      S[name] = r[12]
    end
    if S.sess then
      S[S.sess] = r[13]
    end
  end
  if r[1] and r[11] ~= LAYOUT then
    if (r[11] or '1') ~= '1' or count(r[2]) > 0 or count(r[3]) > 0 then
      -- Written by a version of redsem that keeps another layout: touch nothing.
      error({ 'LAYOUT', STATE, r[11] or '1', LAYOUT })
    end
    r = adopt(r)
  end
  clock()
  if r[1] then
    S.cap = count(r[1])
  end
  S.used, S.qlen, S.seq, S.idle = count(r[2]), count(r[3]), count(r[4]), count(r[5])
  -- (The last token is converted only to make the next one: next_token().)
  S.tok, S.nh, S.nt = r[6], count(r[7]), count(r[8])
  S.next, S.tnext = count(r[9]), count(r[10])
  if not S.cap then
    -- No state. Whatever is left in the other keys belongs to a state that was lost
    -- (evicted, or expired a moment apart): check their types, then clear them.
    local leftover = call(LEASES, 'ZCARD', LEASES) + call(QUEUE, 'ZCARD', QUEUE)
    local slots = redis.call('TYPE', SLOTS)['ok']
    if slots ~= 'none' and slots ~= 'string' then
      error({ key = SLOTS })
    end
    if leftover > 0 or slots == 'string' then
      redis.call('DEL', LEASES, QUEUE, SLOTS)
    end
  elseif not r[7] or (S.used > 0) ~= (S.nh > 0) then
    repair() -- counters missing (a state from an older version) or disagreeing
  end
  S.loaded = true
  return S.cap ~= nil
end

-- Store a capacity; a new state starts with every counter at 0, names its layout and is
-- kept as a hash table (WIDE).
-- An idle state of layout 1 (before client sessions: a minute of tombstones), taken over:
-- every key goes but the capacity and the last token, which start a state of this layout.
-- Answers the fields as load() reads them.
adopt = function(r)
  redis.call('DEL', STATE, LEASES, QUEUE, SLOTS)
  for _, name in ipairs({ 'used', 'nh', 'qlen', 'nt', 'seq', 'idle', 'next', 'tnext' }) do
    put(name, 0)
  end
  put('cap', r[1])
  put('tok', r[6] or '0')
  put('layout', LAYOUT)
  put('wide', WIDE)
  for name in pairs(S) do
    if type(name) == 'string' and (string.sub(name, 1, 2) == 'r:' or string.sub(name, 1, 2) == 's:') then
      S[name] = false
    end
  end
  return { r[1], '0', '0', '0', '0', r[6], '0', '0', '0', '0', LAYOUT }
end

local function set_cap(cap)
  if not S.cap then
    for _, name in ipairs({ 'used', 'nh', 'qlen', 'nt' }) do
      put(name, 0)
    end
    put('layout', LAYOUT)
    put('wide', WIDE)
  end
  put('cap', cap)
end

local function label_add(label, delta)
  if label ~= '' then
    local name = 'label:' .. label
    local n = (tonumber(field(name)) or 0) + delta
    if n > 0 then
      put(name, n)
    else
      put(name, false)
    end
  end
end

-- Ascending slots as runs: {0, 1, 2, 7} -> "0-2,7".
local function runs(slots)
  local out, first = {}, 1
  for i = 1, #slots do
    if slots[i + 1] ~= slots[i] + 1 then
      out[#out + 1] = first == i and string.format('%d', slots[i])
        or string.format('%d-%d', slots[first], slots[i])
      first = i + 1
    end
  end
  return table.concat(out, ',')
end

-- Now in ms as text, formatted once per call (every record a call writes carries it).
local function now_text()
  local t = S.now_text
  if not t then
    t = format('%d', S.now)
    S.now_text = t
  end
  return t
end

-- A record is joined from texts (the counts from text()'s memo), not formatted: a format of
-- seven values cost more than the command that stores it. `token` is the token's text.
local function holder_record(token, k, lease, slots, label)
  local s = #slots == 1 and text(slots[1]) or runs(slots)
  return 'h|' .. token .. '|' .. text(k) .. '|' .. now_text() .. '|' .. text(lease) .. '|' .. s .. '|'
    .. label
end

local function waiter_record(k, lease, waiter_lease, channel, label)
  return 'w|' .. text(k) .. '|' .. now_text() .. '|' .. text(lease) .. '|' .. text(waiter_lease) .. '|'
    .. text(#channel) .. '|' .. channel .. label
end

-- A raw record as a table: holder {h = true, t, k, a, lease, s, l}, waiter {k, w, lease,
-- wl, c, l}; nil if none or unreadable. The token t and the times a
-- and w stay text (converted only where used: a release needs none of them); the counts
-- come from the memo (count()).
local H, W = 104, 119 -- the bytes of 'h', 'w'
local function parse(raw)
  if not raw then
    return nil
  end
  local kind = byte(raw, 1)
  if kind == H then
    local t, k, a, lease, slots, label = match(raw, '^h|(%d+)|(%d+)|(%d+)|(%d+)|([%d,%-]*)|(.*)$')
    if not t then
      return nil
    end
    local one = COUNTS[slots] or tonumber(slots) -- a single slot (the usual case): no runs to split
    if one then
      return { h = true, t = t, k = count(k), a = a, lease = count(lease), s = { one }, l = label }
    end
    local s = {}
    for run in string.gmatch(slots, '[%d%-]+') do
      local first, last = string.match(run, '^(%d+)%-(%d+)$')
      first, last = tonumber(first or run), tonumber(last or run)
      for n = first or 0, last or -1 do
        s[#s + 1] = n
      end
    end
    return { h = true, t = t, k = count(k), a = a, lease = count(lease), s = s, l = label }
  elseif kind == W then
    local k, since, lease, wl, clen, rest = match(raw, '^w|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
    if not k then
      return nil
    end
    clen = count(clen)
    return {
      k = count(k), w = since, lease = count(lease), wl = count(wl),
      c = string.sub(rest, 1, clen), l = string.sub(rest, clen + 1),
    }
  end
  return nil
end

-- A grant's reply, {"GRANTED", token, slot, slot, ...}: the slots in the reply itself (a
-- table inside a reply costs Redis more to convert than the slots in it).
local function granted(token, slots)
  local reply = { 'GRANTED', token }
  for i = 1, #slots do
    reply[i + 2] = slots[i]
  end
  return reply
end

-- {outcome, idle flag, grants handed back...}: a release's reply (see lease_release.lua).
local function released(outcome, idle)
  local reply, handed = { outcome, idle and 1 or 0 }, S.handed
  if handed then
    for i = 1, #handed do
      reply[i + 2] = handed[i]
    end
  end
  return reply
end

local function record(id)
  return parse(field('r:' .. id))
end

-- The next fencing token: larger than the last one, and than every token handed out before
-- the last moment the server clock passed (so a lost state does not send tokens back).
-- Stored (put('tok')) by the grant that hands it out.
local function next_token()
  return max(count(S.tok) + 1, S.now_us)
end

-- Set the lease end of a holder or waiter; `next` keeps the earliest one known.
local function add_lease(id, ends)
  local added = call(LEASES, 'ZADD', LEASES, digits(ends), id)
  if S.next == 0 or ends < S.next then
    put('next', ends)
  end
  return added
end

-- Set (bit 1) or clear (bit 0) the n slot bits from `first`: whole bytes with one SETRANGE,
-- the bits of partial bytes one by one (at most 14 SETBITs).
local BIT = { [0] = '0', [1] = '1' } -- (as text: see digits())
local function set_run(first, n, bit)
  local i, stop = first, first + n
  while i < stop and i % 8 ~= 0 do
    call(SLOTS, 'SETBIT', SLOTS, digits(i), BIT[bit])
    i = i + 1
  end
  local bytes = floor((stop - i) / 8)
  if bytes > 0 then
    call(SLOTS, 'SETRANGE', SLOTS, i / 8, string.rep(bit == 1 and '\255' or '\0', bytes))
    i = i + bytes * 8
  end
  while i < stop do
    call(SLOTS, 'SETBIT', SLOTS, digits(i), BIT[bit])
    i = i + 1
  end
end

-- Set or clear the bits of ascending `slots`, run by run.
local function set_slots(slots, bit)
  local first = 1
  for i = 1, #slots do
    if slots[i + 1] ~= slots[i] + 1 then
      set_run(slots[first], i - first + 1, bit)
      first = i + 1
    end
  end
end

-- Each unit takes the lowest free slot. Past the end of the bitmap every slot is free, so
-- the units that land there take one run: a grant costs a few commands per hole it fills,
-- not per unit.
-- One unit (the usual request) needs no STRLEN: it takes the first clear bit, which BITPOS
-- finds past the end of the bitmap too (no end given), with one SETBIT either way.
local function grant(id, k, label, lease, expires)
  -- The token first: a corrupt last token (converted only here) fails before a slot is taken.
  local token = next_token()
  local slots, from, free_from = {}, 0, 0
  local i = 1
  if S.used > 0 then
    if k == 1 then
      local s = call(SLOTS, 'BITPOS', SLOTS, '0')
      rcall('SETBIT', SLOTS, digits(s), '1')
      slots[1], i = s, 2
    else
      free_from = call(SLOTS, 'STRLEN', SLOTS) * 8
    end
  end
  while i <= k do
    local s = free_from
    if s > 0 then
      s = redis.call('BITPOS', SLOTS, 0, from)
    end
    if s >= free_from then
      set_run(s, k - i + 1, 1)
      for n = 0, k - i do
        slots[i + n] = s + n
      end
      break
    end
    rcall('SETBIT', SLOTS, digits(s), '1')
    slots[i] = s
    from = floor(s / 8)
    i = i + 1
  end
  -- The lease entry after the slots: a foreign value at leases fails here, and the slots are
  -- cleared again, so the call changes nothing and spends no token (as the fast path does).
  local ok, failure = pcall(add_lease, id, expires)
  if not ok then
    set_slots(slots, 0)
    error(failure)
  end
  put('tok', token)
  local token_text = format('%d', token)
  put('r:' .. id, holder_record(token_text, k, lease, slots, label))
  put('used', S.used + k)
  put('nh', S.nh + 1)
  return token, slots, token_text
end

-- Mark the caller's sequence number `seq` (text) with `mark` in its session record, and
-- raise the record's low mark to the caller's (S.low); a new or renewed record's expiry is
-- registered in leases (see prune()).
local function mark(seq, mark_letter)
  local name = S.sess
  local value, renewed = session_put(S.low, seq, mark_letter)
  put(name, value)
  if renewed then
    if call(LEASES, 'ZADD', LEASES, digits(-renewed), name) == 1 then
      put('nt', S.nt + 1)
    end
    if S.tnext == 0 then
      put('tnext', renewed)
    end
  end
end


local function drop_holder(id, r)
  set_slots(r.s, 0)
  put('r:' .. id, false)
  put('used', max(S.used - r.k, 0))
  put('nh', max(S.nh - 1, 0))
  label_add(r.l, -1)
end

local function drop_waiter(id, r)
  S.heads = nil -- (perhaps inside the window peek() read: read it again)
  call(QUEUE, 'ZREM', QUEUE, id)
  put('r:' .. id, false)
  put('qlen', math.max(S.qlen - 1, 0))
  label_add(r.l, -1)
end

-- The window at the head of the queue, S.heads from S.at on: the first ids of the queue
-- (two, or one more than the releases of a batch: S.window), with their records read (one
-- HMGET for those this call has not read yet, instead of an HGET each as record() would).
-- Kept for the rest of the call: promote() takes its heads from the front, new waiters join
-- behind it, and whatever else removes a waiter (drop_waiter(), repair()) drops the window.
local function peek()
  local ids = call(QUEUE, 'ZRANGE', QUEUE, '0', text((S.window or 2) - 1))
  local names, n = {}, 0
  for i = 1, #ids do
    local name = 'r:' .. ids[i]
    if S[name] == nil then
      n = n + 1
      names[n] = name
    end
  end
  if n > 0 then
    local raws = call(STATE, 'HMGET', STATE, unpack(names, 1, n))
    for i = 1, n do
      S[names[i]] = raws[i]
    end
  end
  S.heads, S.at = ids, 1
end

-- Grant, in arrival order, every waiter at the head of the queue that now fits, and wake
-- exactly those: one message each on their client's channel,
-- "id|token|slot,slot|ms since its last check-in". A grant woken by message is unclaimed:
-- its lease entry keeps the end of the waiter lease of its last check-in (or a lease from
-- now, if that ends sooner), so a waiter that
-- died costs no more than that (settle then drops the grant like an expired holder). The
-- waiter's claim (its check-in, a renewal, a resent acquire) gives it its full lease from
-- then; the waiter counts the unclaimed grant from its last check-in, which is never later
-- than the server's. A grant handed back to the caller's own process (the local hand-off)
-- is claimed at once: its lease is the waiter's own lease, from now. Stops at the first
-- waiter that does not fit, so a large request is
-- never overtaken by smaller ones behind it, and when WORK_BUDGET is spent.
-- A waiter asking for more than the capacity is dropped and woken to learn it.
-- The queue is read a window at a time (see peek()): every step that goes on removes the
-- head, so the next id of the window is the next head, and a release that grants one
-- waiter looks at the next one without reading the queue again (nor does the next release
-- of a batch).
local function promote()
  while S.qlen > 0 and budget > 0 do
    if not (S.heads and S.heads[S.at]) then
      peek()
    end
    local head = S.heads[S.at]
    if not head then
      repair() -- qlen says someone waits, the queue is empty
      return
    end
    S.at = S.at + 1
    local w = record(head)
    if not w or w.h then
      redis.call('ZREM', QUEUE, head)
      put('qlen', math.max(S.qlen - 1, 0))
    elseif w.k > S.cap then
      drop_waiter(head, w)
      redis.call('ZREM', LEASES, head)
      wake(w.c, head)
    elseif S.used + w.k > S.cap then
      S.at = S.at - 1 -- (still the head)
      return
    else
      budget = budget - w.k
      local place_ends = tonumber(redis.call('ZSCORE', LEASES, head)) or (S.now + w.wl)
      local checked_in = place_ends - w.wl
      local mine = w.c == S.mine
      -- Unclaimed (woken by message): until its place would have ended, and never longer
      -- than its lease; at least a moment, so it is never due in this very call.
      local ends = S.now + w.lease
      if not mine then
        ends = max(min(place_ends, ends), S.now + 1)
      end
      local _, slots, token = grant(head, w.k, w.l, w.lease, ends)
      redis.call('ZREM', QUEUE, head)
      put('qlen', math.max(S.qlen - 1, 0))
      local listed = #slots == 1 and text(slots[1]) or table.concat(slots, ',')
      local grant_msg = head .. '|' .. token .. '|' .. listed .. '|' .. text(max(S.now - checked_in, 0))
      if mine then
        -- A waiter of the caller's own process: handed over with the reply, no PUBLISH.
        S.handed = S.handed or {}
        S.handed[#S.handed + 1] = grant_msg
      else
        wake(w.c, grant_msg)
      end
      if S.used >= S.cap then
        -- Full again: no waiter fits, so the next head is not read now. (What promote()
        -- would still do there, see promote_left(), waits for the next unit freed.)
        return
      end
    end
  end
end

-- Drop session records past their expiry, in batches once the first is PRUNE_LAG_MS late.
-- (Their entries in leases are named as their fields: s:<session>.)
local function prune()
  if S.tnext == 0 or S.tnext + PRUNE_LAG_MS > S.now then
    return
  end
  local due = call(LEASES, 'ZRANGEBYSCORE', LEASES, -S.now, '(0', 'LIMIT', 0, PRUNE_BATCH)
  for _, name in ipairs(due) do
    S[name] = false
  end
  for i = 1, #due, SLICE do
    redis.call('HDEL', STATE, unpack(due, i, math.min(i + SLICE - 1, #due)))
    redis.call('ZREM', LEASES, unpack(due, i, math.min(i + SLICE - 1, #due)))
  end
  put('nt', math.max(S.nt - #due, 0))
  local first = #due < PRUNE_BATCH and redis.call('ZREVRANGEBYSCORE', LEASES, '(0', '-inf', 'LIMIT', 0, 1, 'WITHSCORES')[2]
  if #due == PRUNE_BATCH then
    put('tnext', S.now - PRUNE_LAG_MS) -- more are due
  else
    put('tnext', first and -tonumber(first) or 0)
  end
end

-- The settle's promote, for work an earlier script left (its budget spent, or a step it
-- could not finish). Not while every unit is held: then no waiter fits, and what promote()
-- would still do at the head (drop a waiter larger than a shrunk capacity, or an entry
-- without its waiter record) waits until units are free, when the next promote() reaches
-- it. (Every script that frees units promotes before it ends, so a contended call does not
-- read the queue head for nothing.)
local function promote_left()
  if S.used < S.cap then
    promote()
  end
end

-- Drop expired holders and waiters (at most SETTLE_BATCH, and holders only while the budget
-- lasts: the rest stay counted until a later script), then promote. Skipped while `next`
-- says no lease can have ended yet.
local function settle()
  prune()
  if S.next > S.now then
    promote_left()
    return
  end
  local due = call(LEASES, 'ZRANGEBYSCORE', LEASES, 0, S.now, 'LIMIT', 0, SETTLE_BATCH)
  if #due > 0 then
    local names = {}
    for i, id in ipairs(due) do
      names[i] = 'r:' .. id
    end
    local raws = redis.call('HMGET', STATE, unpack(names))
    local done = {}
    for i, id in ipairs(due) do
      local r = parse(raws[i])
      S[names[i]] = raws[i]
      if r and r.h then
        if budget < r.k and #done > 0 then
          break
        end
        budget = budget - r.k
        drop_holder(id, r)
      elseif r then
        drop_waiter(id, r)
      end
      done[#done + 1] = id
    end
    redis.call('ZREM', LEASES, unpack(done))
  end
  local first = redis.call('ZRANGEBYSCORE', LEASES, 0, '+inf', 'LIMIT', 0, 1, 'WITHSCORES')[2]
  put('next', first and tonumber(first) or NEVER)
  promote_left()
end

-- When to look again without a wake-up: the head waiter also when the first lease ends.
-- `behind`: the caller knows the waiter is not at the head (no ZRANK).
local function recheck_ms(id, waiter_lease, behind)
  local wait = math.floor(waiter_lease / 3)
  if S.next > 0 and not behind and redis.call('ZRANK', QUEUE, id) == 0 then
    wait = math.min(wait, S.next - S.now + 1)
  end
  return math.max(wait, 1)
end

-- True if the entries of leases or the bits of the slot bitmap disagree with the counters
-- (one ZCARD, one BITCOUNT): then repaired. Once per call: nothing but the call itself
-- changes the keys while it runs, and its operations keep the counters (a batch's queued
-- acquires would otherwise check eight times).
local function check()
  if S.checked then
    return false
  end
  S.checked = true
  if call(LEASES, 'ZCARD', LEASES) ~= S.nh + S.qlen + S.nt or call(SLOTS, 'BITCOUNT', SLOTS) ~= S.used then
    repair()
    return true
  end
  return false
end

-- Rebuild the counters, labels, the slot bitmap and the two zsets from the records: every
-- holder record keeps its unit (with a lease entry of its full lease from now if it had
-- none, so no live holder is overtaken), a waiter without its queue or lease entry is
-- dropped (it re-queues when it checks in), a session record without its expiry entry gets
-- one (a full SESSION_MS from now), entries without a record go. Linear in the
-- size of the semaphore; runs only when a check finds a disagreement.
repair = function()
  S.heads = nil
  local leases, queued = {}, {}
  local entries = call(LEASES, 'ZRANGE', LEASES, 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    leases[entries[i]] = tonumber(entries[i + 1])
  end
  for _, id in ipairs(call(QUEUE, 'ZRANGE', QUEUE, 0, -1)) do
    queued[id] = true
  end
  local slots = redis.call('TYPE', SLOTS)['ok']
  if slots ~= 'none' and slots ~= 'string' then
    error({ key = SLOTS })
  end
  local all = redis.call('HGETALL', STATE)
  local used, nh, nq, nt, labels, keep = 0, 0, 0, 0, {}, {}
  redis.call('DEL', SLOTS)
  for i = 1, #all, 2 do
    local name, raw = all[i], all[i + 1]
    if string.sub(name, 1, 6) == 'label:' then
      put(name, false)
    elseif string.sub(name, 1, 2) == 's:' then
      if not leases[name] or leases[name] >= 0 then
        leases[name] = -(S.now + SESSION_MS)
        redis.call('ZADD', LEASES, leases[name], name)
      end
      nt, keep[name] = nt + 1, true
    elseif string.sub(name, 1, 2) == 'r:' then
      local id = string.sub(name, 3)
      local r = parse(raw)
      S[name] = raw
      if r and r.h then
        if not leases[id] then
          redis.call('ZADD', LEASES, S.now + r.lease, id)
          leases[id] = S.now + r.lease
        end
        queued[id] = nil
        set_slots(r.s, 1)
        used, nh, keep[id] = used + r.k, nh + 1, true
        labels[r.l] = (labels[r.l] or 0) + 1
      elseif r and leases[id] and queued[id] then
        nq, keep[id] = nq + 1, true
        labels[r.l] = (labels[r.l] or 0) + 1
      else
        put(name, false)
      end
    end
  end
  for id in pairs(leases) do
    if not keep[id] then
      redis.call('ZREM', LEASES, id)
    end
  end
  for id in pairs(queued) do
    if not keep[id] then
      redis.call('ZREM', QUEUE, id)
    end
  end
  for label, n in pairs(labels) do
    if label ~= '' then
      put('label:' .. label, n)
    end
  end
  put('used', used)
  put('nh', nh)
  put('qlen', nq)
  put('nt', nt)
  -- Keys of older versions carried TTLs while live; none do now.
  persist({ LEASES, QUEUE, STATE })
  put('keep', false)
  put('idle', 0)
  put('next', 0) -- unknown: the next settle looks
  put('tnext', nt > 0 and S.now - PRUNE_LAG_MS or 0)
end


-- Start a call: its keys, a fresh per-call state and the hooks run() calls.
local HOOKS = { load = load, settle = settle, save = keep }
local function expected()
  return { [LEASES] = 'zset', [QUEUE] = 'zset', [STATE] = 'hash', [SLOTS] = 'string' }
end
local function begin(keys)
  LEASES, QUEUE, STATE, SLOTS = keys[1], keys[2], keys[3], keys[4]
  -- S, sized for the fields every call sets (and the caller's record).
  start(STATE, expected, HOOKS, {
    now = nil, now_us = nil, loaded = nil, cap = nil, used = nil, qlen = nil, seq = nil, idle = nil,
    tok = nil, nh = nil, nt = nil, next = nil, tnext = nil, mine = nil, defer_idle = nil,
    read = nil, checked = nil, heads = nil, at = nil, window = nil, now_text = nil,
  })
  budget = WORK_BUDGET
end

-- The two operations a group commit carries (lease_batch), also run one at a time by
-- lease_acquire and lease_release: the body of each, on a loaded and settled state.

-- A new request (see lease_acquire.lua): its arguments are A[o + 1] .. A[o + 8] (id,
-- capacity, units, lease ms, label, one per label, mode, waiter lease ms), its wake channel
-- `channel`, its sequence number in the caller's session `seq` (text).
local function acquire_op(A, o, channel, seq)
  local id, cap, k, lease = A[o + 1], number(A[o + 2]), number(A[o + 3]), number(A[o + 4])
  local label, exclusive, mode = A[o + 5], A[o + 6] == '1', A[o + 7]
  local waiter_lease = number(A[o + 8])
  if not (cap and k and lease and waiter_lease) then
    return redis.error_reply('lease_acquire: a count is not a number')
  elseif k > MAX_UNITS then
    return { 'TOOMANY', MAX_UNITS }
  end
  if session_stale(seq) or session_mark(seq) == 'X' then
    -- A late copy of an enqueue that was withdrawn, or answered long ago: not applied.
    return { 'GONE' }
  end
  local mine = record(id)
  if mine then
    -- Resent: answer as the first attempt did, renewing what it got.
    add_lease(id, S.now + (mine.h and lease or waiter_lease))
    if mine.h then
      return granted(tonumber(mine.t), mine.s)
    end
    return { 'QUEUED', redis.call('ZRANK', QUEUE, id) or 0, recheck_ms(id, waiter_lease) }
  end

  if S.cap ~= cap then
    if S.cap and (S.used > 0 or S.qlen > 0) then
      return { 'CONFLICT', S.cap }
    end
    set_cap(cap)
  end
  if k > cap then
    return { 'TOOBIG', cap }
  end
  if exclusive and label ~= '' and (tonumber(field('label:' .. label)) or 0) > 0 then
    return { 'LABEL', label }
  end

  if not (S.qlen == 0 and S.used + k <= cap) and check() then
    promote()
  end
  if S.qlen == 0 and S.used + k <= cap then
    local token, slots = grant(id, k, label, lease, S.now + lease)
    label_add(label, 1)
    return granted(token, slots)
  end
  if mode ~= 'wait' then
    return { 'BUSY', S.used, S.qlen }
  end

  local position = S.qlen
  call(QUEUE, 'ZADD', QUEUE, digits(S.seq + 1), id)
  add_lease(id, S.now + waiter_lease)
  put('seq', S.seq + 1)
  put('qlen', position + 1)
  put('r:' .. id, waiter_record(k, lease, waiter_lease, channel, label))
  label_add(label, 1)
  -- Queued behind others (their tickets are lower): not the head.
  return { 'QUEUED', position, recheck_ms(id, waiter_lease, position > 0) }
end

-- A holder's release ("r") or a withdrawal ("w") of `id`, by the call numbered `seq` (text)
-- in the caller's session (see lease_release.lua); answers its outcome. Grants it makes to
-- waiters on S.mine are collected in S.handed.
local OUTCOMES = { R = 'RELEASED', D = 'DEQUEUED' }
local function release_op(id, seq, kind)
  if not S.cap then
    return 'NOTHELD'
  end
  if kind == 'r' then
    if session_stale(seq) then
      return 'NOTHELD'
    end
    local done = OUTCOMES[session_mark(seq)]
    if done then
      return done -- resent: answered as the first attempt was
    end
  end
  local r = record(id)
  local outcome = 'NOTHELD'
  if r then
    -- (The entry first: a foreign value at leases fails here, before anything is changed.)
    call(LEASES, 'ZREM', LEASES, id)
  end
  if r and r.h then
    drop_holder(id, r)
    outcome = 'RELEASED'
  elseif r then
    drop_waiter(id, r)
    outcome = 'DEQUEUED'
  end
  if kind == 'r' and r then
    mark(seq, r.h and 'R' or 'D')
  elseif kind == 'w' and seq ~= '0' then
    -- The enqueue numbered seq went unanswered: a late copy of it is refused.
    mark(seq, 'X')
  end
  promote()
  return outcome
end

-- The fast paths: the uncontended cycle, a grant of one unit with nobody queued and the
-- release of such a grant with nobody queued, written straight to the keys: no field cache,
-- no settle, no write-back loop. Each applies only where the general path (acquire_op,
-- release_op) would do exactly the same commands: the state is of this layout with its
-- counters agreeing, nothing is due (no lease has ended, no session record waits to be
-- pruned), the caller's session has no mark for the call and does not find it stale,
-- the keys carry no idle TTL, no label is involved. Otherwise it answers nil and the general
-- path runs on the same read (load() takes S.read): nothing is read twice. Same replies,
-- same records, same first touch of every key (a read, or a write that fails unchanged).

-- The state, the caller's record (the field `name`) and session record, as load() reads
-- them, and the time.
local function read_state(name)
  local r = call(STATE, 'HMGET', STATE, 'cap', 'used', 'qlen', 'seq', 'idle', 'tok', 'nh', 'nt', 'next',
    'tnext', 'layout', name, S.sess)
  S.read = r
  if S.sess then
    S[S.sess] = r[13]
  end
  clock()
  return r
end

-- Whether the state read (`r`) is one a fast path may take: of this layout with its
-- counters agreeing, nobody queued, no idle TTL, nothing due (no lease ended: `next`, 0 =
-- unknown, is still ahead; no session record to prune), and with `room`, a unit free. The cheap
-- tests come first: a contended call is turned away before any number is converted. Also
-- the counters: capacity, units in use, holders, `next` and `tnext` (converted once).
local function quiet(r, room)
  if not r[1] or r[3] ~= '0' or r[11] ~= LAYOUT or not r[7] or (r[5] and r[5] ~= '0') then
    return false
  end
  local cap, used, nh = count(r[1]), count(r[2]), count(r[7])
  if (room and used >= cap) or (used > 0) ~= (nh > 0) then
    return false
  end
  local next_end, tnext = count(r[9]), count(r[10])
  if next_end <= S.now or (tnext > 0 and tnext + PRUNE_LAG_MS <= S.now) then
    return false
  end
  return true, cap, used, nh, next_end, tnext
end

-- lease_acquire of one unit without a label, by a new request, with room and nobody queued.
local function fast_acquire(A, name)
  local id = A[1]
  local r = read_state(name)
  if r[12] or A[3] ~= '1' or A[5] ~= '' then
    return nil
  end
  if r[13] and (session_stale(A[10]) or session_mark(A[10])) then
    return nil
  end
  local ok, cap, used, nh, next_end = quiet(r, true)
  local lease = number(A[4])
  if not (ok and cap == number(A[2]) and lease and number(A[8])) then
    return nil
  end
  local token, ends, slot = max(count(r[6]) + 1, S.now_us), S.now + lease, 0
  if used > 0 then
    slot = call(SLOTS, 'BITPOS', SLOTS, '0')
  end
  call(SLOTS, 'SETBIT', SLOTS, digits(slot), '1')
  local added = rpcall('ZADD', LEASES, digits(ends), id)
  if type(added) == 'table' and added.err then
    -- A foreign value at leases: the slot is free again, and nothing is changed.
    rcall('SETBIT', SLOTS, digits(slot), '0')
    error({ key = LEASES, cause = added })
  end
  local tok = format('%d', token)
  local held = holder_record(tok, 1, lease, { slot }, '')
  if ends < next_end then
    rcall('HSET', STATE, 'used', text(used + 1), 'nh', text(nh + 1), 'tok', tok, name, held,
      'next', text(ends))
  else
    rcall('HSET', STATE, 'used', text(used + 1), 'nh', text(nh + 1), 'tok', tok, name, held)
  end
  return { 'GRANTED', token, slot }
end

-- lease_release of a holder of one unit without a label, with nobody queued, by a call
-- whose session record needs no renewal. (A resend finds no record: the general path
-- answers it from its mark.)
local function fast_release(A, name)
  if A[6] ~= 'r' then
    return nil
  end
  local r = read_state(name)
  local ok, _, used, nh = quiet(r)
  local slot = ok and r[12] and match(r[12], '^h|%d+|1|%d+|%d+|(%d+)|$')
  if not slot or session_stale(A[3]) then
    return nil
  end
  local session, renewed = session_put(S.low, A[3], 'R')
  if renewed or not session then
    -- (The general path writes it and registers the expiry, or keeps it with other marks:
    -- read it afresh there.)
    S[S.sess], S.sl, S.smarks = r[13], nil, nil
    return nil
  end
  call(SLOTS, 'SETBIT', SLOTS, slot, '0')
  local removed = rpcall('ZREM', LEASES, A[1])
  if type(removed) == 'table' and removed.err then
    -- A foreign value at leases: the slot goes back to its holder, and nothing is changed.
    rcall('SETBIT', SLOTS, slot, '1')
    error({ key = LEASES, cause = removed })
  end
  used, nh = max(used - 1, 0), max(nh - 1, 0)
  rcall('HSET', STATE, 'used', text(used), 'nh', text(nh), S.sess, session)
  rcall('HDEL', STATE, name)
  -- Idle now (no TTL yet: quiet() saw none): lease_tidy gives it one.
  return { 'RELEASED', used == 0 and 1 or 0 }
end
