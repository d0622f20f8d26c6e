-- permit_available: the permits available now and the requests waiting, after dropping
-- waiters whose lease ended.
-- KEYS: see permit_prelude.lua
-- ARGV: none
-- Returns: {"AVAILABLE", available (0 if never set), waiting requests, 1 if set else 0}
--        | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
settle(now_ms())
return { 'AVAILABLE', available(), redis.call('ZCARD', QUEUE), redis.call('EXISTS', COUNT) }
