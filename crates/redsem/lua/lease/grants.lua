-- lease/grants: labels, fencing tokens, lease entries, the slot bitmap, and a grant made or
-- dropped.

-- Count one more (delta 1) or one fewer (-1) holder or waiter with the label `label` (none
-- for no label, ""): the field label:<label>, gone at 0.
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

-- Whether a holder or waiter has the label `label` (never for no label, "").
local function label_held(label)
  return label ~= '' and (tonumber(field('label:' .. label)) or 0) > 0
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
local function grant(id, k, label, lease, expires, tenant)
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
  put('r:' .. id, holder_record(token_text, k, lease, slots, label, tenant))
  put('used', S.used + k)
  put('nh', S.nh + 1)
  return token, slots, token_text
end

-- A holder's units freed: its slots cleared, its record gone, the counters, its label and
-- (with tenants) its tenant's units counted down.
local function drop_holder(id, r)
  set_slots(r.s, 0)
  put('r:' .. id, false)
  put('used', max(S.used - r.k, 0))
  put('nh', max(S.nh - 1, 0))
  label_add(r.l, -1)
  if S.tmode then
    tenant_add(r.tn or '', -r.k, 0)
  end
end
