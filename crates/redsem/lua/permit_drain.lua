-- permit_drain: take every available permit. A count at or below zero is left as it is.
-- KEYS: see permit_prelude.lua
-- ARGV: none
-- Returns: {"DRAINED", permits taken} | {"WRONGTYPE", key, actual, expected}
return run(function()
  local count = S.count or 0
  if count <= 0 then
    return { 'DRAINED', 0 }
  end
  add(-count)
  return { 'DRAINED', count }
end)
