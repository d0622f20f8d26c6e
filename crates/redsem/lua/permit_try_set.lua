-- permit_try_set: set the count to PERMITS if it was never set (a count of 0 is set), then
-- hand permits to requests that queued before it was set.
-- Applied once per request id: a repeated call answers "SET" again.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id   ARGV[2] permits (>= 0)
-- Returns: {"SET"} | {"EXISTS", available} | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local rid = ARGV[1]
local now = now_ms()
settle(now)
if redis.call('ZSCORE', APPLIED, rid) then
  return { 'SET' }
end
if redis.call('EXISTS', COUNT) == 1 then
  return { 'EXISTS', available() }
end
redis.call('SET', COUNT, ARGV[2])
remember(rid, nil, now)
promote()
touch(now)
return { 'SET' }
