-- lease_set_capacity: change the capacity in force. Live permits are never revoked: after a
-- shrink, new grants wait until the units in use fall below the new capacity.
-- KEYS: see lease/layout.lua
-- ARGV[1] new capacity
-- Returns: {"OK", previous capacity (-1 if none)} | {"WRONGTYPE", key, actual, expected}
local cap = number(ARGV[1])
-- The capacity stored, and the waiters that now fit granted.
return run(function()
  local old = S.cap or -1
  set_cap(cap)
  promote()
  return { 'OK', old }
end)
