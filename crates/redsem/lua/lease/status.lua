-- lease_status: a snapshot of a lease semaphore, after dropping what has expired (and
-- repairing the counters if they disagree with the records).
-- KEYS: see lease/layout.lua
-- ARGV: none
-- Returns: {"STATUS", capacity (-1 if none stored), units in use,
--           {{id, label, token, lease ms left, held for ms, {slots}, tenant}, ...}  (grant order)
--           {{id, label, k, waiting for ms, tenant}, ...}                         (arrival order)
--           {{tenant, units held, waiters, weight, cap or -1}, ...}}
--             (the tenants, by name, only while a named tenant holds or waits: the default
--              tenant "" among them if it holds or waits)
--        | {"WRONGTYPE", key, actual, expected}
return run(function()
  if not S.cap then
    return { 'STATUS', -1, 0, {}, {}, {} }
  end
  check()

  local holders, tenants = {}, {}
  local function tenant_row(name)
    local row = tenants[name]
    if not row then
      local t = S.tmode and tenant_get(name)
      row = { name, 0, 0, t and t.weight or 1, t and t.cap or -1 }
      tenants[name] = row
    end
    return row
  end
  local leases = call(LEASES, 'ZRANGE', LEASES, 0, -1, 'WITHSCORES')
  for i = 1, #leases, 2 do
    local r = record(leases[i])
    if r and r.h then
      holders[#holders + 1] = {
        leases[i], r.l, tonumber(r.t), tonumber(leases[i + 1]) - S.now, S.now - tonumber(r.a), r.s, r.tn or '',
      }
      local row = tenant_row(r.tn or '')
      row[2] = row[2] + r.k
    end
  end
  table.sort(holders, function(a, b) return a[3] < b[3] end)
  -- The waiters by ticket: the default tenant's (queue) and the named tenants' (tqueue).
  local queued = {}
  local entries = call(QUEUE, 'ZRANGE', QUEUE, 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    queued[#queued + 1] = { entries[i], tonumber(entries[i + 1]) }
  end
  for _, member in ipairs(call(TQUEUE, 'ZRANGE', TQUEUE, 0, -1)) do
    local at = string.find(member, '\0', 1, true)
    if at then
      queued[#queued + 1] = { string.sub(member, at + 17), tonumber(string.sub(member, at + 1, at + 16), 16) or 0 }
    end
  end
  table.sort(queued, function(a, b) return a[2] < b[2] end)
  local waiters = {}
  for _, entry in ipairs(queued) do
    local id = entry[1]
    local w = record(id)
    if w and not w.h then
      waiters[#waiters + 1] = { id, w.l, w.k, S.now - tonumber(w.w), w.tn or '' }
      local row = tenant_row(w.tn or '')
      row[3] = row[3] + 1
    end
  end
  local rows = {}
  if S.tmode then
    for _, row in pairs(tenants) do
      rows[#rows + 1] = row
    end
    table.sort(rows, function(a, b) return a[1] < b[1] end)
  end
  return { 'STATUS', S.cap, S.used, holders, waiters, rows }
end)
