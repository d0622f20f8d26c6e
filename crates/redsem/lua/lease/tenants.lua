-- lease/tenants: fair shares between tenants. A request may name a tenant (none: the default
-- tenant ""), with the tenant's weight (default 1) and cap (units it may hold at once; none by
-- default). While no named tenant holds or waits, nothing here runs and the queue is the
-- plain FIFO it always was. Once one does (layout 3, see lease/layout.lua), every tenant,
-- the default one too, has a record t:<tenant> = "held|waiting|weight|cap|turn", and the
-- next grant goes to the turn: the tenant with the lowest held / weight among those that wait
-- and whose head fits their cap (ties: the earliest head), which the zset `tenants` keeps in
-- order (ZRANGE 0 0). Within a tenant, first in first out: the default tenant's waiters are in
-- `queue` (by ticket), a named tenant's in `tqueue` (one lex range per tenant). The turn's
-- head is never overtaken: if it does not fit in the free units, nobody is granted.
--
-- Where weights and caps live: in the tenant's record, set by the first request that names the
-- tenant while it neither holds nor waits, and gone with the record when it holds and waits no
-- more. A request naming another weight or cap while the record lives is refused ({"TENANT",
-- tenant, weight, cap}), as a capacity is: every request carries what its caller configured,
-- so a disagreement between callers shows at once instead of being mixed.
--
-- Cost: a grant reads the turn (ZRANGE 0 0), the head of its tenant (one ZRANGE or
-- ZRANGEBYLEX ... LIMIT 0 1), and lists the tenant again under its new score (ZADD, a ZREM
-- if its head changed): O(log tenants + log waiters), whatever the number of tenants.

-- A ticket as 16 hex digits: in lex order as in number order.
local function ticket_text(n)
  return format('%016x', n)
end

-- A named tenant's waiter in tqueue.
local function tq_member(tenant, ticket, id)
  return tenant .. '\0' .. ticket .. id
end

-- The record of `tenant`, as a table {held, wait, weight, cap (nil: none), turn}; nil if none.
-- Read once per call (S.tt), written back by tenant_save().
local function tenant_get(tenant)
  local tt = S.tt
  if not tt then
    tt = {}
    S.tt = tt
  end
  local t = tt[tenant]
  if t == nil then
    t = false
    local raw = field('t:' .. tenant)
    if raw then
      local held, wait, weight, cap, turn = match(raw, '^(%d+)|(%d+)|(%d+)|(%d*)|(%x*)$')
      if not held then
        error({ key = STATE, expected = 'hash of a semaphore (a tenant record is not one)' })
      end
      t = {
        held = count(held), wait = count(wait), weight = tonumber(weight),
        cap = cap ~= '' and tonumber(cap) or nil, turn = turn,
      }
    end
    tt[tenant] = t
  end
  return t or nil
end

local function tenant_save(tenant, t)
  S.tt = S.tt or {}
  S.tt[tenant] = t or false
  put('t:' .. tenant, t and (text(t.held) .. '|' .. text(t.wait) .. '|' .. text(t.weight) .. '|'
    .. (t.cap and text(t.cap) or '') .. '|' .. t.turn) or false)
end

-- The named tenants with a record (the field tn).
local function tenant_count()
  return tonumber(field('tn')) or 0
end

-- The first waiter of `tenant`: its id and ticket (a number); nil if none waits.
local function tenant_head(tenant)
  if tenant == '' then
    local h = call(QUEUE, 'ZRANGE', QUEUE, '0', '0', 'WITHSCORES')
    if h[1] then
      return h[1], tonumber(h[2])
    end
    return nil
  end
  local h = call(TQUEUE, 'ZRANGEBYLEX', TQUEUE, '[' .. tenant .. '\0', '(' .. tenant .. '\1', 'LIMIT', '0', '1')
  if h[1] then
    local at = #tenant + 2
    return string.sub(h[1], at + 16), tonumber(string.sub(h[1], at, at + 15), 16)
  end
  return nil
end

-- List `tenant` (its record `t`) in the turns as it stands: while it waits and its head fits
-- its cap, under its head's ticket and scored held / weight; else not at all.
local function tenant_turn(tenant, t)
  local turn = ''
  if t.wait > 0 then
    local head, ticket = tenant_head(tenant)
    if head then
      local w = record(head)
      if not (t.cap and w and t.held + w.k > t.cap) then
        turn = ticket_text(ticket)
      end
    end
  end
  if t.turn ~= '' and t.turn ~= turn then
    call(TENANTS, 'ZREM', TENANTS, t.turn .. tenant)
  end
  if turn ~= '' then
    call(TENANTS, 'ZADD', TENANTS, format('%.17g', t.held / t.weight), turn .. tenant)
  end
  t.turn = turn
end

-- Tenants come: the state is of layout 3 from now on, and the default tenant gets its record
-- (every unit held and every waiter so far is its own) and, if it waits, its turn.
local function enter_tenants()
  S.tmode, S.heads = true, nil
  put('layout', LAYOUT_TENANTS)
  local t = { held = S.used, wait = S.qlen, weight = 1, cap = nil, turn = '' }
  tenant_turn('', t)
  tenant_save('', t)
end

-- The last named tenant went: back to layout 2, the default tenant's record and turn gone.
local function leave_tenants()
  local t = tenant_get('')
  if t and t.turn ~= '' then
    call(TENANTS, 'ZREM', TENANTS, t.turn)
  end
  tenant_save('', nil)
  put('tn', false)
  put('layout', LAYOUT)
  S.tmode, S.heads = false, nil
end

-- A named tenant's new record (its first request while it neither holds nor waits).
local function tenant_new(tenant, weight, cap)
  if not S.tmode then
    enter_tenants()
  end
  local t = { held = 0, wait = 0, weight = weight, cap = cap, turn = '' }
  put('tn', tenant_count() + 1)
  tenant_save(tenant, t)
  return t
end

-- `tenant` holds `held` units more (or fewer) and has `wait` waiters more (or fewer): its
-- record and its turn follow; a named tenant that neither holds nor waits any more loses its
-- record, and with the last one the tenants go (leave_tenants). `same_turn`: the caller knows
-- its turn does not change (a waiter queued behind others).
local function tenant_add(tenant, held, wait, same_turn)
  local t = tenant_get(tenant)
  if not t then
    return -- (no record: repair() rebuilds them)
  end
  t.held, t.wait = max(t.held + held, 0), max(t.wait + wait, 0)
  if not same_turn then
    tenant_turn(tenant, t)
  end
  if tenant ~= '' and t.held == 0 and t.wait == 0 then
    tenant_save(tenant, nil)
    local n = tenant_count() - 1
    put('tn', n)
    if n <= 0 then
      leave_tenants()
    end
  else
    tenant_save(tenant, t)
  end
end

-- Whether a new request of `k` units by a tenant with the record `t` (nil: none yet; weight
-- and cap as it names them) is granted now: the units are free, its cap allows them, and it
-- is the turn: nobody waits, or the tenant has no waiter of its own and its held / weight is
-- below the turn's (a tie goes to the earlier head, which is not this one).
local function turn_fits(k, t, weight, cap)
  local held = t and t.held or 0
  if S.used + k > S.cap or (cap and held + k > cap) then
    return false
  elseif S.qlen == 0 then
    return true
  elseif t and t.wait > 0 then
    return false
  end
  local best
  if S.tmode then
    best = tonumber(call(TENANTS, 'ZRANGE', TENANTS, '0', '0', 'WITHSCORES')[2])
  else
    best = S.used -- (everyone waiting is the default tenant's, weight 1, holding every unit)
  end
  return best == nil or held / weight < best
end
