-- permit_add: add DELTA permits (a release, or add_permits; DELTA may be negative, and the
-- count may go below zero), then hand what is available to the head of the queue.
-- Applied once per request id: a call repeated with the same id changes nothing.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id   ARGV[2] delta (integer)
-- Returns: {"ADDED", available}
--        | {"REPEATED", available}   (this id was applied already)
--        | {"RANGE", available}      (the count would leave +-(2^53 - 1); nothing changed)
--        | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local rid, delta = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
settle(now)
if redis.call('ZSCORE', APPLIED, rid) then
  return { 'REPEATED', available() }
end
local count = available()
if math.abs(count + delta) > MAX_ABS then
  return { 'RANGE', count }
end
redis.call('INCRBY', COUNT, ARGV[2])
remember(rid, nil, now)
promote()
touch(now)
return { 'ADDED', available() }
