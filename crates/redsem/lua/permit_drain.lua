-- permit_drain: take every available permit. A count at or below zero is left as it is.
-- Applied once per request id: a repeated call takes nothing more and answers the amount the
-- first one took (the id is remembered as r:<id> "d|n").
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id
-- Returns: {"DRAINED", permits taken} | {"WRONGTYPE", key, actual, expected}
local name = 'r:' .. ARGV[1]
return run(function()
  local st, taken = parse(S[name])
  if st == 'd' then
    return { 'DRAINED', taken }
  end
  local count = S.count or 0
  remember(name)
  if count <= 0 then
    put(name, 'd|0')
    return { 'DRAINED', 0 }
  end
  -- Exactly 0, whatever was given back on the way.
  redis.call('SET', COUNT, 0)
  S.count, S.taken, S.create_count = 0, 0, false
  put(name, string.format('d|%d', count))
  return { 'DRAINED', count }
end, name)
