-- lease/state: the state hash read (load), a state of an older layout adopted, a capacity
-- stored, the idle TTL kept, and the counters checked and rebuilt from the records (repair).

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

local repair, adopt

-- The state's fields in what read_state() and read_batch() answer (their HMGET), by name:
-- stored[CAP] is the field cap as stored (text; false if absent). (The reply itself, not a
-- table of named fields: filling one costs a call more than all its reads.)
local CAP, USED, QLEN, SEQ, IDLE, TOK, NH, NT, NEXT, TNEXT, LAYOUT_AT = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11
-- And after them, in read_state()'s: the caller's record (the field `name`) and session
-- record (S.sess).
local RECORD, SESSION = 12, 13

-- The state hash as stored, by one HMGET (see CAP...), with the caller's record `name` and
-- session record S.sess, which also go to the field cache S.
local function read_state(name)
  local stored = call(STATE, 'HMGET', STATE, 'cap', 'used', 'qlen', 'seq', 'idle', 'tok', 'nh', 'nt', 'next',
    'tnext', 'layout', name or 'r:', S.sess or 's:')
  if name then
    S[name] = stored[RECORD]
  end
  if S.sess then
    S[S.sess] = stored[SESSION]
  end
  return stored
end

-- The same for a batch: the state with the fields `names` (the records of its requests, then
-- the session's), which go to the field cache S (the same id twice reads the same field).
local function read_batch(names)
  local stored = call(STATE, 'HMGET', STATE, 'cap', 'used', 'qlen', 'seq', 'idle', 'tok', 'nh', 'nt', 'next',
    'tnext', 'layout', unpack(names))
  for i = 1, #names do
    S[names[i]] = stored[LAYOUT_AT + i]
  end
  return stored
end

-- Read the state (and the caller's record `name` and session record, see read_state()), and
-- the time; true if there is a state to settle. The counters become numbers in S (S.cap,
-- S.used, S.qlen, S.seq, S.idle, S.nh, S.nt, S.next, S.tnext); the last token stays text
-- (S.tok, converted only to make the next one: next_token()).
local function load(name)
  -- (Read already by a fast path whose case this is not: see read_ahead().)
  local stored = S.read or (type(name) == 'table' and read_batch(name) or read_state(name))
  if stored[CAP] and stored[LAYOUT_AT] ~= LAYOUT and stored[LAYOUT_AT] ~= LAYOUT_TENANTS then
    if (stored[LAYOUT_AT] or '1') ~= '1' or count(stored[USED]) > 0 or count(stored[QLEN]) > 0 then
      -- Written by a version of redsem that keeps another layout: touch nothing.
      error({ 'LAYOUT', STATE, stored[LAYOUT_AT] or '1', LAYOUT })
    end
    stored = adopt(stored)
  end
  clock()
  if stored[CAP] then
    S.cap = count(stored[CAP])
  end
  S.used, S.qlen, S.seq, S.idle = count(stored[USED]), count(stored[QLEN]), count(stored[SEQ]), count(stored[IDLE])
  S.tok, S.nh, S.nt = stored[TOK], count(stored[NH]), count(stored[NT])
  S.next, S.tnext = count(stored[NEXT]), count(stored[TNEXT])
  S.tmode = stored[LAYOUT_AT] == LAYOUT_TENANTS
  if not S.cap then
    -- No state. Whatever is left in the other keys belongs to a state that was lost
    -- (evicted, or expired a moment apart): check their types, then clear them.
    local leftover = call(LEASES, 'ZCARD', LEASES) + call(QUEUE, 'ZCARD', QUEUE)
      + call(TENANTS, 'ZCARD', TENANTS) + call(TQUEUE, 'ZCARD', TQUEUE)
    local slots = redis.call('TYPE', SLOTS)['ok']
    if slots ~= 'none' and slots ~= 'string' then
      error({ key = SLOTS })
    end
    if leftover > 0 or slots == 'string' then
      redis.call('DEL', LEASES, QUEUE, SLOTS, TENANTS, TQUEUE)
    end
  elseif not stored[NH] or (S.used > 0) ~= (S.nh > 0) then
    repair() -- counters missing (a state from an older version) or disagreeing
  end
  S.loaded = true
  return S.cap ~= nil
end

-- An idle state of layout 1 (before client sessions: a minute of tombstones), taken over:
-- every key goes but the capacity and the last token, which start a state of this layout.
-- Answers the fields as read_state() does.
adopt = function(stored)
  redis.call('DEL', STATE, LEASES, QUEUE, SLOTS, TENANTS, TQUEUE)
  for _, name in ipairs({ 'used', 'nh', 'qlen', 'nt', 'seq', 'idle', 'next', 'tnext' }) do
    put(name, 0)
  end
  put('cap', stored[CAP])
  put('tok', stored[TOK] or '0')
  put('layout', LAYOUT)
  put('wide', WIDE)
  for name in pairs(S) do
    if type(name) == 'string' and (string.sub(name, 1, 2) == 'r:' or string.sub(name, 1, 2) == 's:') then
      S[name] = false
    end
  end
  local fresh = {}
  fresh[CAP], fresh[TOK], fresh[LAYOUT_AT] = stored[CAP], stored[TOK], LAYOUT
  for _, at in ipairs({ USED, QLEN, SEQ, IDLE, NH, NT, NEXT, TNEXT }) do
    fresh[at] = '0'
  end
  return fresh
end

-- Store a capacity; a new state starts with every counter at 0, names its layout and is
-- kept as a hash table (WIDE).
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
  S.heads, S.tt = nil, nil
  local leases, queued, tqueued = {}, {}, {}
  local entries = call(LEASES, 'ZRANGE', LEASES, 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    leases[entries[i]] = tonumber(entries[i + 1])
  end
  for _, id in ipairs(call(QUEUE, 'ZRANGE', QUEUE, 0, -1)) do
    queued[id] = true
  end
  for _, member in ipairs(call(TQUEUE, 'ZRANGE', TQUEUE, 0, -1)) do
    local at = string.find(member, '\0', 1, true)
    tqueued[member] = at and string.sub(member, at + 17) or ''
  end
  call(TENANTS, 'ZCARD', TENANTS) -- (its type checked before anything is deleted)
  local slots = redis.call('TYPE', SLOTS)['ok']
  if slots ~= 'none' and slots ~= 'string' then
    error({ key = SLOTS })
  end
  local all = redis.call('HGETALL', STATE)
  local used, nh, nq, nt, labels, keep = 0, 0, 0, 0, {}, {}
  -- Tenants: the units and waiters of each, and the weights and caps their records name.
  local held, waiting, named, configured = { [''] = 0 }, { [''] = 0 }, {}, {}
  redis.call('DEL', SLOTS, TENANTS)
  for i = 1, #all, 2 do
    local name, raw = all[i], all[i + 1]
    if string.sub(name, 1, 6) == 'label:' or name == 'tn' then
      put(name, false)
    elseif string.sub(name, 1, 2) == 't:' then
      local weight, cap = match(raw, '^%d+|%d+|(%d+)|(%d*)|')
      configured[string.sub(name, 3)] = weight and { tonumber(weight), cap ~= '' and tonumber(cap) or nil }
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
      local tenant = r and r.tn or ''
      local member = r and r.tk and tq_member(tenant, r.tk, id)
      if r and r.h then
        if not leases[id] then
          redis.call('ZADD', LEASES, S.now + r.lease, id)
          leases[id] = S.now + r.lease
        end
        queued[id] = nil
        set_slots(r.s, 1)
        used, nh, keep[id] = used + r.k, nh + 1, true
        labels[r.l] = (labels[r.l] or 0) + 1
        held[tenant] = (held[tenant] or 0) + r.k
        waiting[tenant] = waiting[tenant] or 0
      elseif r and leases[id] and (member and tqueued[member] == id or not member and queued[id]) then
        nq, keep[id] = nq + 1, true
        labels[r.l] = (labels[r.l] or 0) + 1
        if member then
          tqueued[member] = true
        end
        held[tenant] = held[tenant] or 0
        waiting[tenant] = (waiting[tenant] or 0) + 1
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
  for member, kept in pairs(tqueued) do
    if kept ~= true then
      redis.call('ZREM', TQUEUE, member)
    end
  end
  -- The tenants' records and turns, as the records say (a tenant whose record was lost gets
  -- weight 1 and no cap); none if no named tenant holds or waits.
  local tenants = 0
  for tenant in pairs(held) do
    if tenant ~= '' then
      tenants = tenants + 1
    end
  end
  S.tt, S.tmode = {}, tenants > 0
  put('layout', tenants > 0 and LAYOUT_TENANTS or LAYOUT)
  put('tn', tenants > 0 and tenants or false)
  for tenant in pairs(tenants > 0 and held or {}) do
    local c = configured[tenant] or {}
    local t = { held = held[tenant], wait = waiting[tenant], weight = c[1] or 1, cap = c[2], turn = '' }
    tenant_turn(tenant, t)
    tenant_save(tenant, t)
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
