-- permit_withdraw: a cancelled or timed-out request leaves. Permits handed to it (collected
-- or not: the caller never learned of them) are given back, so it takes nothing. The id is
-- remembered as withdrawn, so a late or repeated acquire with it is refused.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id
-- Returns: {"WITHDRAWN"}              (it was waiting; nothing was taken)
--        | {"RETURNED", permits}      (it had been granted; the permits were given back)
--        | {"UNKNOWN"}                (no such request, or already withdrawn)
--        | {"WRONGTYPE", key, actual, expected}
local id = ARGV[1]
local name = 'r:' .. id
return run(function()
  local st, k = parse(S[name])
  remember(name)
  local result = { 'UNKNOWN' }
  if st == 'w' then
    put('qlen', math.max(S.qlen - call(QUEUE, 'ZREM', QUEUE, id), 0))
    result = { 'WITHDRAWN' }
  elseif st == 'g' or st == 'c' then
    add(k)
    result = { 'RETURNED', k }
  end
  if st == 'w' or st == 'g' then
    put('wlen', math.max(S.wlen - call(WAITERS, 'ZREM', WAITERS, id), 0))
  end
  put(name, 'x')
  promote()
  return result
end, name)
