-- permit_try_set: set the count to PERMITS if it was never set (a count of 0 is set), then
-- hand permits to requests that queued before it was set.
-- Applied once per request id: a repeated call answers "SET" again.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id   ARGV[2] permits (>= 0)
-- Returns: {"SET"} | {"EXISTS", available} | {"WRONGTYPE", key, actual, expected}
return run(function()
  local name = 'm:' .. ARGV[1]
  if remembered(APPLIED, name) then
    return { 'SET' }
  end
  if S.count then
    return { 'EXISTS', S.count }
  end
  remember(name)
  redis.call('SET', COUNT, ARGV[2])
  S.count = tonumber(ARGV[2])
  promote()
  return { 'SET' }
end)
