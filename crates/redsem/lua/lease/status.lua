-- lease_status: a snapshot of a lease semaphore, after dropping what has expired (and
-- repairing the counters if they disagree with the records).
-- KEYS: see lease/layout.lua
-- ARGV: none
-- Returns: {"STATUS", capacity (-1 if none stored), units in use,
--           {{id, label, token, lease ms left, held for ms, {slots}}, ...}   (grant order)
--           {{id, label, k, waiting for ms}, ...}}                         (queue order)
--        | {"WRONGTYPE", key, actual, expected}
return run(function()
  if not S.cap then
    return { 'STATUS', -1, 0, {}, {} }
  end
  check()

  local holders = {}
  local leases = call(LEASES, 'ZRANGE', LEASES, 0, -1, 'WITHSCORES')
  for i = 1, #leases, 2 do
    local r = record(leases[i])
    if r and r.h then
      holders[#holders + 1] = { leases[i], r.l, tonumber(r.t), tonumber(leases[i + 1]) - S.now, S.now - tonumber(r.a), r.s }
    end
  end
  table.sort(holders, function(a, b) return a[3] < b[3] end)
  local waiters = {}
  for _, id in ipairs(call(QUEUE, 'ZRANGE', QUEUE, 0, -1)) do
    local w = record(id)
    if w and not w.h then
      waiters[#waiters + 1] = { id, w.l, w.k, S.now - tonumber(w.w) }
    end
  end
  return { 'STATUS', S.cap, S.used, holders, waiters }
end)
