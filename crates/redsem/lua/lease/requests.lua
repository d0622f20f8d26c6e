-- lease/requests: the replies of grants and releases, and the two requests a group commit
-- (lease_batch) carries, also run one at a time by lease_acquire and lease_release.

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
