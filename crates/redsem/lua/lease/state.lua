-- lease/state: the state hash read (load), a state of an older layout adopted, a capacity
-- stored, the idle TTL kept, and the counters checked and rebuilt from the records (repair).

-- Nobody holds or waits, and the keys lack their idle TTL (or it ends soon).
local function needs_idle_ttl()
  return S.used == 0 and S.qlen == 0 and S.idle < S.now + KEEP_MARGIN_MS
end

-- Give the keys the TTL the state calls for (common's save() then writes the fields back).
-- A release defers the idle TTL to lease_tidy: S.defer_idle.
local function keep()
  if not S.cap then
    return
  end
  if (S.used > 0 or S.qlen > 0) and S.idle > 0 then
    -- Live state carries no TTL. (The slot bitmap and the queue never get one.)
    persist({ STATE, LEASES })
    put('idle', 0)
  elseif needs_idle_ttl() and not S.defer_idle then
    put('idle', S.now + KEEP_IDLE_MS)
    expire_at(S.idle, { STATE, LEASES })
    -- The bitmap has no bit left: it goes (not a foreign value: BITCOUNT would fail).
    if redis.pcall('BITCOUNT', SLOTS) == 0 then
      redis.call('DEL', SLOTS)
    end
  end
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
