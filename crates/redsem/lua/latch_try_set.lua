-- latch_try_set: set the count to COUNT unless the latch exists (counting). An opened or
-- deleted latch can be set again; that clears its done marker, and its remembered ids stop
-- expiring (the latch counts again).
-- Applied once per request id: a repeated call answers "SET" again.
-- KEYS: see latch_prelude.lua
-- ARGV[1] request id   ARGV[2] count (1 .. 2^53 - 1)
-- Returns: {"SET"} | {"EXISTS", count} | {"WRONGTYPE", key, actual, expected}
return run(function()
  local rid = ARGV[1]
  local count = read_count()
  if count then
    if remembered(APPLIED, rid) then
      return { 'SET' }
    end
    return { 'EXISTS', count }
  end
  local done = call(DONE, 'GET', DONE)
  if not remember(rid) then
    return { 'SET' }
  end
  redis.call('SET', COUNT, ARGV[2])
  persist({ APPLIED })
  if done then
    redis.call('DEL', DONE)
  end
  return { 'SET' }
end)
