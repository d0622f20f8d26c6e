-- permit_poll: a queued request checks in. Renews its place in the queue, or, if permits
-- were handed to it while it waited, collects them.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id   ARGV[2] waiter lease ms
-- Returns: {"GRANTED"}                       (also when repeated after a collection)
--        | {"QUEUED", position, recheck ms}
--        | {"GONE"}        (neither queued nor granted: its waiter lease ended, or withdrawn)
--        | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local id, waiter_lease = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
settle(now)
local raw = redis.call('HGET', RECORDS, id)
if not raw then
  return { 'GONE' }
end
return check_in(id, cjson.decode(raw), now, waiter_lease)
