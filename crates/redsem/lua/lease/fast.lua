-- lease/fast: the fast paths, the uncontended cycle, a grant of one unit with nobody queued and the
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
