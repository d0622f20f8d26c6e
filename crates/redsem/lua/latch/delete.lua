-- latch_delete: remove the latch (count, session records). If it was counting, the done marker
-- says "deleted" for DONE_MS, so its waiters return rather than report a lost latch, and
-- "opened" is published on its channel (last, with pcall); otherwise the done marker goes too.
-- KEYS: see latch/prelude.lua
-- ARGV[1] the latch's channel
-- Returns: {"DELETED", 1 if it was counting else 0} | {"WRONGTYPE", key, actual, expected}
local channel = ARGV[1]
return run(function()
  -- Check every key first: a foreign value is reported, never deleted.
  local count = read_count()
  call(DONE, 'GET', DONE)
  call(APPLIED, 'ZCARD', APPLIED)
  call(SESSIONS, 'HLEN', SESSIONS)
  redis.call('DEL', COUNT, DONE, APPLIED, SESSIONS)
  if count then
    redis.call('SET', DONE, 'deleted', 'PX', DONE_MS)
    wake(channel, 'opened')
    return { 'DELETED', 1 }
  end
  return { 'DELETED', 0 }
end)
