-- permit_batch: the group commit of one client on one permit semaphore: the acquires,
-- additions (releases), withdrawals and check-ins its tasks have in flight, applied in the order given
-- with the outcomes each would have had one by one, on one read of the time and the records
-- and one write-back.
-- KEYS: see permit_prelude.lua
-- ARGV[1] the caller's wake channel, then the operations one after another:
--   "a", request id, permits k, "try" | "wait", waiter lease ms   (as permit_acquire)
--   "m", request id, delta                                        (as permit_add)
--   "w", request id                                               (as permit_withdraw)
--   "p", request id, waiter lease ms                              (as permit_poll)
-- Returns: {{reply of each operation, in order}} | {"WRONGTYPE", key, actual, expected}
local names, at = {}, 2
while at <= #ARGV do
  local kind = ARGV[at]
  if kind == 'a' then
    names[#names + 1] = 'r:' .. ARGV[at + 1]
    at = at + 5
  elseif kind == 'm' then
    at = at + 3
  elseif kind == 'w' then
    names[#names + 1] = 'r:' .. ARGV[at + 1]
    at = at + 2
  elseif kind == 'p' then
    names[#names + 1] = 'r:' .. ARGV[at + 1]
    at = at + 3
  else
    return redis.error_reply('permit_batch: unknown operation ' .. tostring(kind))
  end
end
return run(function()
  local replies, i = {}, 2
  while i <= #ARGV do
    local kind = ARGV[i]
    if kind == 'a' then
      replies[#replies + 1] = acquire_op(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], tonumber(ARGV[i + 4]), ARGV[1])
      i = i + 5
    elseif kind == 'm' then
      replies[#replies + 1] = add_op(ARGV[i + 1], ARGV[i + 2])
      i = i + 3
    elseif kind == 'w' then
      replies[#replies + 1] = withdraw_op(ARGV[i + 1])
      i = i + 2
    else
      replies[#replies + 1] = check_in(ARGV[i + 1], tonumber(ARGV[i + 2]))
      i = i + 3
    end
  end
  return { replies }
end, names)
