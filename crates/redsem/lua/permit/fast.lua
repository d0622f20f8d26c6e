-- permit/fast: the fast paths, the uncontended cycle, a grant with nobody waiting and the addition (a
-- release) with nobody waiting, written straight to the keys: no field cache, no settle, no
-- write-back. Each applies only where the general path (acquire_op, add_op) issues exactly
-- the same commands: the bookkeeping is in place (keep, wide, this layout), nobody waits and
-- no grant is uncollected (qlen, wlen 0, not live), no session record is due to be dropped
-- (prune ahead), the call is neither stale nor marked and its mark needs no renewal of the
-- session record. Otherwise it answers nil before its first write, and the general path runs
-- on the same read (load() takes S.read, and the count if read).

-- The time, and the fields load() reads with the field `name` and the caller's session
-- record, as load() reads them (kept for it in S.read).
local function read_ahead(name)
  clock()
  local stored = read_records(name)
  S.read = stored
  return stored
end

-- Whether the fields read (`stored`) let a fast path run (see above).
local function quiet(stored)
  if stored[LIVE] or not (stored[KEEP] and stored[PRUNE] and stored[WIDE_AT]) or stored[LAYOUT_AT] ~= LAYOUT
    or (stored[WLEN] and stored[WLEN] ~= '0') or (stored[QLEN] and stored[QLEN] ~= '0') then
    return false
  end
  local prune = tonumber(stored[PRUNE])
  return prune and S.now < prune
end

-- The caller's session record with the call numbered `seq` marked `mark`, unless the call is
-- stale or marked already, or the record needs renewing or keeps other marks (the general
-- path then): nil.
local function fast_mark(stored, seq, mark_text)
  if stored[SESSION] and (session_stale(seq) or session_mark(seq)) then
    return nil
  end
  local value, renewed = session_put(S.low, seq, mark_text)
  if renewed or not value then
    S[S.sess], S.sl, S.smarks = stored[SESSION], nil, nil -- (read afresh by the general path)
    return nil
  end
  return value
end

-- permit_acquire of a new request (see permit/acquire.lua) that the count holds, with
-- nobody waiting.
local function fast_acquire(request, name)
  local stored = read_ahead(name)
  if stored[RECORD] or not quiet(stored) then
    return nil
  end
  local k, count = tonumber(request.k), read_count()
  if not (count and k) or count < k then
    return nil
  end
  local session = fast_mark(stored, request.seq, 'G' .. request.k)
  if not session then
    return nil
  end
  rcall('INCRBY', COUNT, '-' .. text(k))
  rcall('HSET', RECORDS, S.sess, session)
  return { 'GRANTED' }
end

-- permit_add (see permit/add.lua) of `delta` within +-MAX_INT, with nobody waiting (the
-- count is not read: INCRBY answers it).
local function fast_add(request)
  local stored = read_ahead('keep')
  if not quiet(stored) then
    return nil
  end
  local delta = tonumber(request.delta)
  if not delta or math.abs(delta) > MAX_INT then
    return nil
  end
  local session = fast_mark(stored, request.seq, 'A')
  if not session then
    return nil
  end
  local count = call(COUNT, 'INCRBY', COUNT, request.delta)
  if math.abs(count) <= MAX_INT and math.abs(count - delta) <= MAX_INT then
    rcall('HSET', RECORDS, S.sess, session)
    return { 'ADDED', count }
  end
  -- Out of range: taken back, and the call not marked (nothing changed). A count beyond
  -- +-MAX_INT before the call is not one of ours: reported as foreign, as a read reports it.
  count = redis.call('DECRBY', COUNT, request.delta)
  if math.abs(count) > MAX_INT then
    error({ key = COUNT })
  end
  return { 'RANGE', count }
end
