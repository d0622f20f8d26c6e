-- permit_delete: remove the semaphore: its count and every queued request. Waiters find out
-- at their next check-in ("GONE") and queue again on the semaphore that is then never set.
-- KEYS: see permit/layout.lua
-- ARGV: none
-- Returns: {"DELETED", 1 if the count was set else 0} | {"WRONGTYPE", key, actual, expected}
return run(function()
  -- Check every key first: a foreign value is reported, never deleted.
  local count = read_count()
  call(QUEUE, 'ZCARD', QUEUE)
  call(WAITERS, 'ZCARD', WAITERS)
  call(RECORDS, 'HLEN', RECORDS)
  call(META, 'HLEN', META)
  call(APPLIED, 'ZCARD', APPLIED)
  redis.call('DEL', COUNT, QUEUE, WAITERS, RECORDS, META, APPLIED)
  return { 'DELETED', count and 1 or 0 }
end, nil, 'bare')
