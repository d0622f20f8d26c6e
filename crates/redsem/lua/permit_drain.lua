-- permit_drain: take every available permit. A count at or below zero is left as it is.
-- KEYS: see permit_prelude.lua
-- ARGV: none
-- Returns: {"DRAINED", permits taken} | {"WRONGTYPE", key, actual, expected}
return run(function()
  local count = S.count or 0
  if count <= 0 then
    return { 'DRAINED', 0 }
  end
  -- Exactly 0, whatever was given back on the way.
  redis.call('SET', COUNT, 0)
  S.count, S.taken, S.create_count = 0, 0, false
  return { 'DRAINED', count }
end)
