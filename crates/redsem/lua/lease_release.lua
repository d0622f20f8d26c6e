-- lease_release: give back a permit, or withdraw a queued request (a cancelled acquire),
-- and hand the freed units to the head of the queue.
-- KEYS: see lease_prelude.lua
-- ARGV[1] permit or request id
-- Returns: {"RELEASED"} | {"DEQUEUED"} | {"NOTHELD"} | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local id = ARGV[1]
local now = now_ms()
local cap = stored_cap()
if not cap then
  return { 'NOTHELD' }
end
settle(now, cap)
if redis.call('ZSCORE', HOLDERS, id) then
  drop_holder(id, cap)
  promote(now, cap)
  return { 'RELEASED' }
end
if redis.call('ZSCORE', QUEUE, id) then
  drop_waiter(id)
  promote(now, cap)
  return { 'DEQUEUED' }
end
return { 'NOTHELD' }
