-- latch_count_down: take one from the count. At 0 the count key is deleted, the done marker
-- set for DONE_MS, and "opened" published on the latch's channel: every waiter wakes.
-- Applied once per request id: a repeated call changes nothing.
-- KEYS: see latch_prelude.lua
-- ARGV[1] request id   ARGV[2] the latch's channel
-- Returns: {"COUNTED", count left}
--        | {"REPEATED", count left}   (this id was applied already)
--        | {"ABSENT"}                 (no latch counting: never set, opened or deleted)
--        | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local rid, channel = ARGV[1], ARGV[2]
local now = now_ms()
if applied(rid, now) then
  return { 'REPEATED', tonumber(redis.call('GET', COUNT) or '0') }
end
if redis.call('EXISTS', COUNT) == 0 then
  return { 'ABSENT' }
end
local left = redis.call('DECR', COUNT)
remember(rid, now)
if left <= 0 then
  redis.call('DEL', COUNT)
  redis.call('SET', DONE, '1', 'PX', DONE_MS)
  redis.call('PUBLISH', channel, 'opened')
  return { 'COUNTED', 0 }
end
return { 'COUNTED', left }
