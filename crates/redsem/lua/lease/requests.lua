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

-- {outcome, idle flag, grants handed back...}: a release's reply (see lease/release.lua).
local function released(outcome, idle)
  local reply, handed = { outcome, idle and 1 or 0 }, S.handed
  if handed then
    for i = 1, #handed do
      reply[i + 2] = handed[i]
    end
  end
  return reply
end

-- A request seen before, resent after a lost reply (its record `mine` is there): answered as
-- the first attempt was, renewing what it got (its lease, or its place in the queue).
local function answer_resend(id, mine, lease, waiter_lease)
  add_lease(id, S.now + (mine.h and lease or waiter_lease))
  if mine.h then
    return granted(tonumber(mine.t), mine.s)
  end
  local rank = waiter_rank(id, mine) or 0
  return { 'QUEUED', rank, recheck_ms(id, waiter_lease, false, rank) }
end

-- Whether `k` units may be granted now: nobody waits, and they fit in the capacity `cap`.
local function fits(k, cap)
  return S.qlen == 0 and S.used + k <= cap
end

-- Grant `k` units to `id` now, for `lease` ms, and count its label (and with tenants, its
-- tenant's units); the GRANTED reply.
local function grant_now(id, k, label, lease, tenant)
  local token, slots = grant(id, k, label, lease, S.now + lease, tenant)
  label_add(label, 1)
  if S.tmode then
    tenant_add(tenant or '', k, 0)
  end
  return granted(token, slots)
end

-- The tenant of a request as given (text: tenant, weight, cap; "" for none), checked: the
-- tenant ("" the default one), its weight (a number, 1 if none) and cap (nil if none); or an
-- error text. The default tenant takes neither.
local function tenant_of(request)
  local tenant, weight, cap = request.tenant or '', request.weight or '', request.tcap or ''
  if tenant == '' then
    if (weight ~= '' and weight ~= '1') or cap ~= '' then
      return nil, 'the default tenant takes no weight and no cap'
    end
    return '', 1, nil
  end
  local w = weight == '' and 1 or tonumber(weight)
  local c = cap ~= '' and tonumber(cap) or nil
  if #tenant > MAX_TENANT or string.find(tenant, '\0', 1, true) then
    return nil, 'a tenant is at most ' .. MAX_TENANT .. ' bytes, without NUL'
  elseif not (w and w >= 1 and w <= MAX_WEIGHT and w == floor(w)) then
    return nil, 'a weight is a whole number from 1 to ' .. MAX_WEIGHT
  elseif cap ~= '' and not (c and c >= 1 and c == floor(c) and c <= MAX_INT) then
    return nil, 'a cap is a whole number from 1'
  end
  return tenant, w, c
end

-- A new request with tenants (a named tenant, or any request while one holds or waits), after
-- the checks every request passes: its tenant's weight and cap checked against those in
-- force, then granted now if it is the turn and fits (turn_fits), else BUSY or queued in its
-- tenant's queue.
local function acquire_turn(request, id, k, lease, waiter_lease, label, tenant, weight, cap)
  local t = S.tmode and tenant_get(tenant)
  if t and tenant ~= '' and (t.weight ~= weight or t.cap ~= cap) then
    return { 'TENANT', tenant, t.weight, t.cap or -1 }
  elseif cap and k > cap then
    return { 'TOOBIG', cap }
  end
  local fits = turn_fits(k, t, weight, cap)
  if not fits and request.mode ~= 'wait' then
    return { 'BUSY', S.used, S.qlen }
  end
  if not t then
    t = tenant_new(tenant, weight, cap)
  end
  if fits then
    return grant_now(id, k, label, lease, tenant)
  end
  return enqueue(id, k, lease, waiter_lease, request.channel, label, tenant)
end

-- The two requests a group commit carries (lease_batch), also run one at a time by
-- lease_acquire and lease_release: the body of each, on a loaded and settled state.

-- A new request (lease_acquire), its arguments named in `request` as given (text): id, cap
-- (the capacity), k (units), lease (ms), label ("" for none), exclusive ("1": one live
-- request per label), mode ("try" | "wait"), waiter_lease (ms), channel (its wake channel)
-- and seq (its number in the caller's session), and tenant, weight, tcap (its tenant, the
-- tenant's weight and cap; "" for none: see lease/tenants.lua). In order: refused unless its counts are
-- numbers and it asks at most MAX_UNITS; GONE if it is a late copy; a resend answered as the
-- first attempt was; the capacity checked against the one in force (and stored if none is
-- in use); its label checked; granted now if nobody waits and it fits (after a repair of the
-- counters, if they disagree with the keys); else BUSY, or (mode "wait") queued.
local function acquire(request)
  local id, label, seq = request.id, request.label, request.seq
  local cap, k = number(request.cap), number(request.k)
  local lease, waiter_lease = number(request.lease), number(request.waiter_lease)
  if not (cap and k and lease and waiter_lease) then
    return redis.error_reply('lease_acquire: a count is not a number')
  elseif k > MAX_UNITS then
    return { 'TOOMANY', MAX_UNITS }
  end
  local tenant, weight, tcap = tenant_of(request)
  if not tenant then
    return redis.error_reply('lease_acquire: ' .. weight)
  end
  if session_stale(seq) or session_mark(seq) == 'X' then
    -- A late copy of an enqueue that was withdrawn, or answered long ago: not applied.
    return { 'GONE' }
  end
  local mine = record(id)
  if mine then
    return answer_resend(id, mine, lease, waiter_lease)
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
  if request.exclusive == '1' and label_held(label) then
    return { 'LABEL', label }
  end

  if tenant ~= '' or S.tmode then
    if not turn_fits(k, S.tmode and tenant_get(tenant), weight, tcap) and check() then
      promote()
    end
    if tenant ~= '' or S.tmode then -- (unless a repair found no tenant left)
      return acquire_turn(request, id, k, lease, waiter_lease, label, tenant, weight, tcap)
    end
  end
  if not fits(k, cap) and check() then
    promote()
  end
  if fits(k, cap) then
    return grant_now(id, k, label, lease)
  end
  if request.mode ~= 'wait' then
    return { 'BUSY', S.used, S.qlen }
  end
  return enqueue(id, k, lease, waiter_lease, request.channel, label)
end

-- A holder's release or a withdrawal (lease_release), its arguments named in `request`: id,
-- kind ("r" a holder's release, "w" a withdrawal) and seq (text: the number of this release
-- in the caller's session, or of the enqueue a withdrawal names as unanswered, "0" if none).
-- In order: NOTHELD without a state; a release that is a late copy answers NOTHELD, and a
-- resend the outcome marked by its first attempt; the holder's units freed or the waiter
-- dropped; the call marked (R released, D withdrawn, X: a late copy of the enqueue a
-- withdrawal names is refused); the freed units promoted to the queue. Answers the outcome;
-- grants made to waiters on S.mine are collected in S.handed.
local OUTCOMES = { R = 'RELEASED', D = 'DEQUEUED' }
local function release(request)
  local id, seq, kind = request.id, request.seq, request.kind
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
