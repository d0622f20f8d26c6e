-- lease/fast: the fast paths of the uncontended cycle, a grant of one unit with nobody
-- queued and the release of such a grant with nobody queued, written straight to the keys:
-- no field cache, no settle, no write-back loop. Each applies only where the general path
-- (acquire(), release() in lease/requests.lua) would do exactly the same commands: the state
-- is of this layout with its counters agreeing, nothing is due (no lease has ended, no
-- session record waits to be pruned), the caller's session has no mark for the call and does
-- not find it stale, the keys carry no idle TTL, no label is involved. Otherwise it answers
-- nil and the general path runs on the same read (load() takes S.read): nothing is read
-- twice. Same replies, same records, same first touch of every key (a read, or a write that
-- fails unchanged).

-- The state, the caller's record (the field `name`) and session record, as load() reads
-- them (kept for it in S.read), and the time.
local function read_ahead(name)
  local stored = read_state(name)
  S.read = stored
  clock()
  return stored
end

-- Whether the state read (`stored`) is one a fast path may take: of this layout with its
-- counters agreeing, nobody queued, no idle TTL, nothing due (no lease ended: `next`, 0 =
-- unknown, is still ahead; no session record to prune), and with `room`, a unit free. The cheap
-- tests come first: a contended call is turned away before any number is converted. Also
-- the counters: capacity, units in use, holders, `next` and `tnext` (converted once).
local function quiet(stored, room)
  if not stored[CAP] or stored[QLEN] ~= '0' or stored[LAYOUT_AT] ~= LAYOUT or not stored[NH]
    or (stored[IDLE] and stored[IDLE] ~= '0') then
    return false
  end
  local cap, used, nh = count(stored[CAP]), count(stored[USED]), count(stored[NH])
  if (room and used >= cap) or (used > 0) ~= (nh > 0) then
    return false
  end
  local next_end, tnext = count(stored[NEXT]), count(stored[TNEXT])
  if next_end <= S.now or (tnext > 0 and tnext + PRUNE_LAG_MS <= S.now) then
    return false
  end
  return true, cap, used, nh, next_end, tnext
end

-- lease_acquire of one unit without a label, by a new request (see lease/acquire.lua), with
-- room and nobody queued.
local function fast_acquire(request, name)
  local stored = read_ahead(name)
  if stored[RECORD] or request.k ~= '1' or request.label ~= '' or request.tenant ~= '' or request.weight ~= ''
    or request.tcap ~= '' then
    return nil
  end
  local ok, cap, used, nh, next_end = quiet(stored, true)
  local lease = number(request.lease)
  if not (ok and cap == number(request.cap) and lease and number(request.waiter_lease)) then
    return nil
  end
  -- The session last: quiet() has seen no record due to be pruned, so what it is parsed to
  -- here is what the general path would find (it parses it once per call).
  if stored[SESSION] and (session_stale(request.seq) or session_mark(request.seq)) then
    return nil
  end
  local token, ends, slot = max(count(stored[TOK]) + 1, S.now_us), S.now + lease, 0
  if used > 0 then
    slot = call(SLOTS, 'BITPOS', SLOTS, '0')
  end
  call(SLOTS, 'SETBIT', SLOTS, digits(slot), '1')
  local added = rpcall('ZADD', LEASES, digits(ends), request.id)
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

-- lease_release of a holder of one unit without a label (see lease/release.lua), with
-- nobody queued, by a call whose session record needs no renewal. (A resend finds no
-- record: the general path answers it from its mark.)
local function fast_release(request, name)
  if request.kind ~= 'r' then
    return nil
  end
  local stored = read_ahead(name)
  local ok, _, used, nh = quiet(stored)
  local slot = ok and stored[RECORD] and match(stored[RECORD], '^h|%d+|1|%d+|%d+|(%d+)|$')
  if not slot or session_stale(request.seq) then
    return nil
  end
  local session, renewed = session_put(S.low, request.seq, 'R')
  if renewed or not session then
    -- (The general path writes it and registers the expiry, or keeps it with other marks:
    -- read it afresh there.)
    S[S.sess], S.sl, S.smarks = stored[SESSION], nil, nil
    return nil
  end
  call(SLOTS, 'SETBIT', SLOTS, slot, '0')
  local removed = rpcall('ZREM', LEASES, request.id)
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
