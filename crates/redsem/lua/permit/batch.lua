-- permit_batch: the group commit of one client on one permit semaphore: the acquires,
-- additions (releases), withdrawals and check-ins its tasks have in flight, applied in the
-- order given with the outcomes each would have had one by one, on one read of the time and
-- the records and one write-back.
-- KEYS: see permit/layout.lua
-- ARGV[1] the caller's wake channel   ARGV[2] its session id   ARGV[3] the session's low
-- mark, then the operations one after another, each with its number in the session:
--   "a", request id, permits k, "try" | "wait", waiter lease ms, number   (as permit_acquire)
--   "m", request id, delta, number                                        (as permit_add)
--   "w", request id, number of its unanswered call or "0"                 (as permit_withdraw)
--   "p", request id, waiter lease ms, number                              (as permit_poll)
-- Returns: {{reply of each operation, in order}} | {"WRONGTYPE", key, actual, expected}
--        | {"LAYOUT", key, found, ours}
local names, at = {}, 4
while at <= #ARGV do
  local kind = ARGV[at]
  if kind == 'a' then
    names[#names + 1] = 'r:' .. ARGV[at + 1]
    at = at + 6
  elseif kind == 'm' then
    at = at + 4
  elseif kind == 'w' then
    names[#names + 1] = 'r:' .. ARGV[at + 1]
    at = at + 3
  elseif kind == 'p' then
    names[#names + 1] = 'r:' .. ARGV[at + 1]
    at = at + 4
  else
    return redis.error_reply('permit_batch: unknown operation ' .. tostring(kind))
  end
end
S.sess, S.low = 's:' .. (ARGV[2] or ''), seqno(ARGV[3])
names[#names + 1] = S.sess
return run(function()
  local replies, i = {}, 4
  while i <= #ARGV do
    local kind = ARGV[i]
    if kind == 'a' then
      replies[#replies + 1] = acquire_op(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], tonumber(ARGV[i + 4]), ARGV[1],
        ARGV[i + 5])
      i = i + 6
    elseif kind == 'm' then
      replies[#replies + 1] = add_op(ARGV[i + 2], ARGV[i + 3])
      i = i + 4
    elseif kind == 'w' then
      replies[#replies + 1] = withdraw_op(ARGV[i + 1], ARGV[i + 2])
      i = i + 3
    else
      replies[#replies + 1] = check_in(ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3])
      i = i + 4
    end
  end
  return { replies }
end, names)
