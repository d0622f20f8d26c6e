-- permit_withdraw: a cancelled or timed-out request leaves. Permits handed to it (collected
-- or not: the caller never learned of them) are given back, so it takes nothing. The id is
-- remembered as withdrawn, so a late or repeated acquire with it is refused.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id
-- Returns: {"WITHDRAWN"}              (it was waiting; nothing was taken)
--        | {"RETURNED", permits}      (it had been granted; the permits were given back)
--        | {"UNKNOWN"}                (no such request, or already withdrawn)
--        | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local id = ARGV[1]
local now = now_ms()
settle(now)
local raw = redis.call('HGET', RECORDS, id)
local w = raw and cjson.decode(raw)
local result = { 'UNKNOWN' }
if w and w.s ~= 'x' then
  redis.call('ZREM', QUEUE, id)
  redis.call('ZREM', WAITERS, id)
  if w.s == 'w' then
    result = { 'WITHDRAWN' }
  else
    redis.call('INCRBY', COUNT, w.k)
    result = { 'RETURNED', w.k }
  end
end
remember(id, { s = 'x', k = 0 }, now)
promote()
touch(now)
return result
