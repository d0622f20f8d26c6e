-- lease_refresh: extend the lease of a live permit to now + lease ms.
-- KEYS: see lease/layout.lua
-- ARGV[1] permit id   ARGV[2] lease ms
-- Returns: {"OK"} | {"NOTHELD"} | {"WRONGTYPE", key, actual, expected}
local id, lease = ARGV[1], number(ARGV[2])
-- A holder's lease entry renewed (and the counters checked if it was missing); NOTHELD for
-- anything else.
return run(function()
  if not S.cap then
    return { 'NOTHELD' }
  end
  local r = record(id)
  if not (r and r.h) then
    return { 'NOTHELD' }
  end
  if add_lease(id, S.now + lease) == 1 then
    check() -- its lease entry was missing
  end
  return { 'OK' }
end, 'r:' .. id)
