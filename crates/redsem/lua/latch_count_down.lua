-- latch_count_down: take one from the count. At 0 the count key is deleted, the done marker
-- set ("1") for DONE_MS, the remembered ids left to expire, and "opened" published on the
-- latch's channel (last, with pcall): every waiter wakes.
-- Applied once per request id: a repeated call changes nothing.
-- KEYS: see latch_prelude.lua
-- ARGV[1] request id   ARGV[2] the latch's channel
-- Returns: {"COUNTED", count left}
--        | {"REPEATED", count left}   (this id was applied already)
--        | {"ABSENT"}                 (no latch counting: never set, opened, deleted or lost)
--        | {"WRONGTYPE", key, actual, expected}
return run(function()
  local rid, channel = ARGV[1], ARGV[2]
  local count = read_count()
  if not count then
    -- Nothing to count: a repeat of a call that opened it, or not counting at all.
    local applied = remembered(APPLIED, rid)
    call(DONE, 'GET', DONE)
    if applied then
      return { 'REPEATED', 0 }
    end
    return { 'ABSENT' }
  end
  if count <= 1 then
    -- It opens: the done marker is written below.
    call(DONE, 'GET', DONE)
  end
  if not remember(rid) then
    return { 'REPEATED', count }
  end
  if count <= 1 then
    redis.call('DEL', COUNT)
    redis.call('SET', DONE, '1', 'PX', DONE_MS)
    expire_at(S.now + REMEMBER_MS, { APPLIED })
    wake(channel, 'opened')
    return { 'COUNTED', 0 }
  end
  return { 'COUNTED', redis.call('DECR', COUNT) }
end)
