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
local channel, session, low = ARGV[1], ARGV[2], ARGV[3]
-- The fields read up front: the records of the requests named, then the session's.
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
open_session(session, low)
names[#names + 1] = S.sess
-- Each operation in order, as the operation it stands for applies it alone.
return run(function()
  local replies, i = {}, 4
  while i <= #ARGV do
    local kind = ARGV[i]
    if kind == 'a' then
      local id, k, mode, waiter_lease, seq = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
      replies[#replies + 1] = acquire_op(id, k, mode, tonumber(waiter_lease), channel, seq)
      i = i + 6
    elseif kind == 'm' then
      local delta, seq = ARGV[i + 2], ARGV[i + 3]
      replies[#replies + 1] = add_op(delta, seq)
      i = i + 4
    elseif kind == 'w' then
      local id, seq = ARGV[i + 1], ARGV[i + 2]
      replies[#replies + 1] = withdraw_op(id, seq)
      i = i + 3
    else
      local id, waiter_lease, seq = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
      replies[#replies + 1] = check_in(id, tonumber(waiter_lease), seq)
      i = i + 4
    end
  end
  return { replies }
end, names)
