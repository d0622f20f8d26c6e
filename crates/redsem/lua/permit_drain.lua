-- permit_drain: take every available permit. A count at or below zero is left as it is.
-- KEYS: see permit_prelude.lua
-- ARGV: none
-- Returns: {"DRAINED", permits taken} | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
settle(now_ms())
local count = available()
if count <= 0 then
  return { 'DRAINED', 0 }
end
redis.call('SET', COUNT, 0)
return { 'DRAINED', count }
