-- latch_count_down: take one from the count. At 0 the count key is deleted, the done marker
-- set ("1") for DONE_MS, the session records left to expire, and "opened" published on the
-- latch's channel (last, with pcall): every waiter wakes.
-- Applied once per call: the same call resent after a lost reply (its number marked C in its
-- session's record) changes nothing, nor does a late copy of a call answered.
-- KEYS: see latch/prelude.lua
-- ARGV[1] this call's sequence number in the client's session   ARGV[2] the session id
-- ARGV[3] the session's low mark (see common.lua)   ARGV[4] the latch's channel
-- Returns: {"COUNTED", count left}
--        | {"REPEATED", count left}   (this call was applied already; nothing changed)
--        | {"ABSENT"}                 (no latch counting: never set, opened, deleted or lost)
--        | {"WRONGTYPE", key, actual, expected}
local seq, session, low, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
return run(function()
  local count = read_count()
  if not count or count <= 1 then
    -- (Read first: written when the latch opens.)
    call(DONE, 'GET', DONE)
  end
  if seen(seq, session, low) then
    return { 'REPEATED', count or 0 }
  end
  if not count then
    return { 'ABSENT' }
  end
  mark(seq, 'C')
  if count <= 1 then
    redis.call('DEL', COUNT)
    redis.call('SET', DONE, '1', 'PX', DONE_MS)
    expire_at(S.now + SESSION_MS, { APPLIED, SESSIONS })
    wake(channel, 'opened')
    return { 'COUNTED', 0 }
  end
  return { 'COUNTED', redis.call('DECR', COUNT) }
end)
