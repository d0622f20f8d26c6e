-- lease_set_capacity: change the capacity in force. Live permits are never revoked: after a
-- shrink, new grants wait until the units in use fall below the new capacity.
-- KEYS: see lease_prelude.lua
-- ARGV[1] new capacity
-- Returns: {"OK", previous capacity (-1 if none)} | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local cap = tonumber(ARGV[1])
local now = now_ms()
local old = stored_cap()
settle(now, old or cap)
redis.call('HSET', META, 'cap', cap)
rebuild_free(cap)
promote(now, cap)
touch(now)
return { 'OK', old or -1 }
