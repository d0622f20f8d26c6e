-- permit_withdraw: a cancelled or timed-out request leaves. Permits handed to it (collected
-- or not: the caller never learned of them) are given back, so it takes nothing. The id is
-- remembered as withdrawn, so a late or repeated acquire with it is refused.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id
-- Returns: {"WITHDRAWN"}              (it was waiting; nothing was taken)
--        | {"RETURNED", permits}      (it had been granted; the permits were given back)
--        | {"UNKNOWN"}                (no such request, or already withdrawn)
--        | {"WRONGTYPE", key, actual, expected}
return run(function()
  return withdraw_op(ARGV[1])
end, 'r:' .. ARGV[1])
