-- latch_state: what the latch is doing.
-- KEYS: see latch/prelude.lua
-- ARGV: none
-- Returns: {"COUNTING", count} | {"DONE"} (opened within DONE_MS)
--        | {"DELETED"} (deleted while counting, within DONE_MS)
--        | {"NEVER"} (never set, deleted while not counting, opened or deleted longer ago, or
--          lost) | {"WRONGTYPE", key, actual, expected}
return run(function()
  local count = read_count()
  if count then
    return { 'COUNTING', count }
  end
  local done = call(DONE, 'GET', DONE)
  call(APPLIED, 'ZCARD', APPLIED)
  call(SESSIONS, 'HLEN', SESSIONS)
  if done == 'deleted' then
    return { 'DELETED' }
  elseif done then
    return { 'DONE' }
  end
  return { 'NEVER' }
end)
