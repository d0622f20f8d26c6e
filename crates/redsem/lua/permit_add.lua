-- permit_add: add DELTA permits (a release, or add_permits; DELTA may be negative, and the
-- count may go below zero), then hand what is available to the head of the queue.
-- Applied once per request id: a call repeated with the same id changes nothing.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id   ARGV[2] delta (integer)
-- Returns: {"ADDED", available}
--        | {"REPEATED", available}   (this id was applied already)
--        | {"RANGE", available}      (the count would leave +-(2^53 - 1); nothing changed)
--        | {"WRONGTYPE", key, actual, expected}
return run(function()
  local name, delta = 'm:' .. ARGV[1], tonumber(ARGV[2])
  local count = S.count or 0
  local applied = call(APPLIED, 'ZSCORE', APPLIED, name)
  if applied and tonumber(applied) > S.now then
    return { 'REPEATED', count }
  end
  if math.abs(count + delta) > MAX_ABS then
    return { 'RANGE', count }
  end
  remember(name)
  if math.abs(delta) > MAX_ABS then
    -- Not exact as a double: let Redis add the digits.
    redis.call('INCRBY', COUNT, ARGV[2])
    S.count = count + delta
  else
    add(delta)
  end
  promote()
  return { 'ADDED', S.count }
end)
