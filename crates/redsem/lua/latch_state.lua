-- latch_state: what the latch is doing.
-- KEYS: see latch_prelude.lua
-- ARGV: none
-- Returns: {"COUNTING", count} | {"DONE"} (opened within DONE_MS) | {"NEVER"} (never set,
--          deleted, or opened longer ago) | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local count = redis.call('GET', COUNT)
if count then
  return { 'COUNTING', tonumber(count) }
end
if redis.call('EXISTS', DONE) == 1 then
  return { 'DONE' }
end
return { 'NEVER' }
