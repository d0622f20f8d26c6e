-- lease_refresh: extend the lease of a live permit to now + lease ms.
-- KEYS: see lease_prelude.lua
-- ARGV[1] permit id   ARGV[2] lease ms
-- Returns: {"OK"} | {"NOTHELD"} | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local id, lease = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local cap = stored_cap()
if not cap then
  return { 'NOTHELD' }
end
settle(now, cap)
if not redis.call('ZSCORE', HOLDERS, id) then
  return { 'NOTHELD' }
end
redis.call('ZADD', HOLDERS, 'XX', now + lease, id)
touch(now)
return { 'OK' }
