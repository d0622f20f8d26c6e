-- latch_try_set: set the count to COUNT unless the latch exists (counting). An opened or
-- deleted latch can be set again; that clears its done marker, and its session records stop
-- expiring (the latch counts again).
-- Applied once per call: the same call resent after a lost reply (its number marked T in its
-- session's record) answers "SET" again, and a late copy of a call answered changes nothing.
-- KEYS: see latch/prelude.lua
-- ARGV[1] this call's sequence number in the client's session   ARGV[2] the session id
-- ARGV[3] the session's low mark (see common.lua)   ARGV[4] count (1 .. 2^53 - 1)
-- Returns: {"SET"} | {"EXISTS", count} | {"WRONGTYPE", key, actual, expected}
local seq, session, low, value = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
return run(function()
  local count = read_count()
  local done = not count and call(DONE, 'GET', DONE)
  if seen(seq, session, low) then
    return { 'SET' }
  end
  if count then
    return { 'EXISTS', count }
  end
  mark(seq, 'T')
  redis.call('SET', COUNT, value)
  persist({ APPLIED, SESSIONS })
  if done then
    redis.call('DEL', DONE)
  end
  return { 'SET' }
end)
