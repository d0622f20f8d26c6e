-- permit/requests: the check-in, and the operations a group commit (permit_batch) applies
-- one after another, and permit_acquire, permit_add and permit_withdraw apply alone.

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
