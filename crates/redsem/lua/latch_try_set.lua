-- latch_try_set: set the count to COUNT unless the latch exists (counting). An opened latch
-- can be set again; that clears its done marker.
-- Applied once per request id: a repeated call answers "SET" again.
-- KEYS: see latch_prelude.lua
-- ARGV[1] request id   ARGV[2] count (>= 1)
-- Returns: {"SET"} | {"EXISTS", count} | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local rid = ARGV[1]
local now = now_ms()
if applied(rid, now) then
  return { 'SET' }
end
local count = redis.call('GET', COUNT)
if count then
  return { 'EXISTS', tonumber(count) }
end
redis.call('SET', COUNT, ARGV[2])
redis.call('DEL', DONE)
remember(rid, now)
return { 'SET' }
