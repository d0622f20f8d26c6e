-- lease_poll: a queued request checks in. Renews its place in the queue, or, if it was
-- granted while it waited, starts its lease now and collects the grant.
-- KEYS: see lease_prelude.lua
-- ARGV[1] request id   ARGV[2] lease ms   ARGV[3] waiter lease ms
-- Returns: {"GRANTED", token, {slots}}
--        | {"QUEUED", position, recheck ms}
--        | {"GONE"}            (neither queued nor granted: evicted, or dropped by a capacity change)
--        | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local id, lease, waiter_lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local cap = stored_cap()
if not cap then
  return { 'GONE' }
end
settle(now, cap)

if redis.call('ZSCORE', HOLDERS, id) then
  redis.call('ZADD', HOLDERS, 'XX', now + lease, id)
  local r = cjson.decode(redis.call('HGET', RECORDS, id))
  touch(now)
  return { 'GRANTED', r.t, r.s }
end
if redis.call('ZSCORE', QUEUE, id) then
  redis.call('ZADD', WAITERS, 'XX', now + waiter_lease, id)
  touch(now)
  return { 'QUEUED', redis.call('ZRANK', QUEUE, id), recheck_ms(now, id, waiter_lease) }
end
return { 'GONE' }
