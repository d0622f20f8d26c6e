-- permit/state: the records hash read (load), an idle layout-1 state taken over, lost
-- bookkeeping rebuilt, and the keep-alive at the save (keep).

-- The records hash's own fields in what read_records() and read_batch() answer (their
-- HMGET), by name: stored[KEEP] is the field keep as stored (text; false if absent). (The
-- reply itself, not a table of named fields: filling one costs a call more than all its
-- reads.)
local KEEP, PRUNE, WLEN, WNEXT, QLEN, LIVE, WIDE_AT, LAYOUT_AT = 1, 2, 3, 4, 5, 6, 7, 8
-- And after them, in read_records()'s: the caller's record (the field `name`) and session
-- record (S.sess).
local RECORD, SESSION = 9, 10

-- The records hash's own fields as stored, by one HMGET (see KEEP...), with the caller's
-- record `name` (or `keep` again) and session record S.sess, which also goes to the field
-- cache S.
local function read_records(name)
  local stored = call(RECORDS, 'HMGET', RECORDS, 'keep', 'prune', 'wlen', 'wnext', 'qlen', 'live', 'wide',
    'layout', name or 'keep', S.sess or 's:')
  if S.sess then
    S[S.sess] = stored[SESSION]
  end
  return stored
end

-- The same for a batch: the fields with `names` (the records of its requests, then the
-- session's), which go to the field cache S.
local function read_batch(names)
  local stored = call(RECORDS, 'HMGET', RECORDS, 'keep', 'prune', 'wlen', 'wnext', 'qlen', 'live', 'wide',
    'layout', unpack(names))
  for i, each in ipairs(names) do
    S[each] = stored[LAYOUT_AT + i]
  end
  return stored
end

-- Read the time, the fields of records (and the field `name`, or each of the list `name`,
-- if given: see read_records(), read_batch()) and the count (with mode "lazy", only if this call needs
-- it: else S.unread is set). The fields become S.keep, S.prune, S.wlen, S.wnext, S.qlen
-- (numbers), S.live and S.wide (text). True if there is bookkeeping to settle.
local function load(name, mode)
  local now = clock()
  -- (Read already if a fast path did not apply: `name` is then a string or nil.)
  local stored = S.read or (type(name) == 'table' and read_batch(name) or read_records(name))
  if stored[LAYOUT_AT] ~= LAYOUT and (stored[KEEP] or stored[WIDE_AT]) then
    -- Records of another layout. Layout 1, idle: taken over; else refused, untouched.
    if (stored[LAYOUT_AT] or '1') ~= '1' or stored[LIVE] or (stored[WLEN] and stored[WLEN] ~= '0')
      or (stored[QLEN] and stored[QLEN] ~= '0') then
      error({ 'LAYOUT', RECORDS, stored[LAYOUT_AT] or '1', LAYOUT })
    end
    call(APPLIED, 'ZCARD', APPLIED)
    redis.call('DEL', RECORDS, APPLIED)
    stored, S.sl = {}, nil
    for each in pairs(S) do
      if type(each) == 'string' and (string.sub(each, 1, 2) == 'r:' or string.sub(each, 1, 2) == 's:') then
        S[each] = false
      end
    end
  end
  -- (Absent fields are false; most calls find wlen and qlen absent or "0".)
  S.keep, S.prune = tonumber(stored[KEEP]) or 0, tonumber(stored[PRUNE])
  S.wlen = stored[WLEN] and stored[WLEN] ~= '0' and tonumber(stored[WLEN]) or 0
  S.qlen = stored[QLEN] and stored[QLEN] ~= '0' and tonumber(stored[QLEN]) or 0
  S.wnext = stored[WNEXT] and tonumber(stored[WNEXT])
  S.live, S.wide = stored[LIVE], stored[WIDE_AT]
  S.loaded = true
  if type(name) == 'string' and S[name] == nil then
    S[name] = stored[RECORD] or false
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
