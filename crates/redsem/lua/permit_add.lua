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
  if not remember(name, true) then
    if S.unread then
      read_count()
    end
    return { 'REPEATED', S.count or 0 }
  end
  if S.unread and math.abs(delta) <= MAX_INT then
    -- Nobody waits and no grant is given back: add first, look after.
    local count = call(COUNT, 'INCRBY', COUNT, ARGV[2])
    if math.abs(count) <= MAX_INT then
      S.count, S.unread = count, false
      return { 'ADDED', count }
    end
    S.count, S.unread = redis.call('DECRBY', COUNT, ARGV[2]), false
  elseif S.unread then
    read_count()
  end
  local count = S.count or 0
  if math.abs(count + delta) > MAX_INT then
    -- Nothing changes, so the id is not remembered either.
    redis.call('ZREM', APPLIED, name)
    if S.fresh_applied then
      S.fresh_applied, S.need = false, 0
      put('prune', false)
    end
    return { 'RANGE', count }
  end
  if math.abs(delta) > MAX_INT then
    -- Not exact as a double: let Redis add the digits.
    redis.call('INCRBY', COUNT, ARGV[2])
    S.count = count + delta
  else
    add(delta)
  end
  promote()
  return { 'ADDED', S.count }
end, nil, 'lazy')
