-- latch_delete: remove the latch (count, done marker, remembered ids). If it was counting,
-- "opened" is published on its channel: its waiters return.
-- KEYS: see latch_prelude.lua
-- ARGV[1] the latch's channel
-- Returns: {"DELETED", 1 if it was counting else 0} | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local counting = redis.call('EXISTS', COUNT)
redis.call('DEL', COUNT, DONE, APPLIED)
if counting == 1 then
  redis.call('PUBLISH', ARGV[1], 'opened')
end
return { 'DELETED', counting }
