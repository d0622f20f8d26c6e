-- permit_delete: remove the semaphore: its count and every queued request. Waiters find out
-- at their next check-in ("GONE") and queue again on the semaphore that is then never set.
-- KEYS: see permit_prelude.lua
-- ARGV: none
-- Returns: {"DELETED", 1 if the count was set else 0} | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local set = redis.call('EXISTS', COUNT)
redis.call('DEL', COUNT, QUEUE, WAITERS, RECORDS, META, APPLIED)
return { 'DELETED', set }
