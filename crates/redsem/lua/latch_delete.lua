-- latch_delete: remove the latch (count, done marker, remembered ids). If it was counting,
-- "opened" is published on its channel: its waiters return.
-- KEYS: see latch_prelude.lua
-- ARGV[1] the latch's channel
-- Returns: {"DELETED", 1 if it was counting else 0} | {"WRONGTYPE", key, actual, expected}
return run(function()
  -- Check every key first: a foreign value is reported, never deleted.
  local count = read_count()
  call(DONE, 'GET', DONE)
  call(APPLIED, 'ZCARD', APPLIED)
  redis.call('DEL', COUNT, DONE, APPLIED)
  if count then
    redis.call('PUBLISH', ARGV[1], 'opened')
    return { 'DELETED', 1 }
  end
  return { 'DELETED', 0 }
end)
