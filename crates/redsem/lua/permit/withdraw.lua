-- permit_withdraw: a cancelled or timed-out request leaves. Permits handed to it (collected
-- or not: the caller never learned of them) are given back, so it takes nothing; the call
-- of it that went unanswered (its enqueue or a check-in), if any, is named and marked
-- withdrawn, so a late copy of it is refused.
-- KEYS: see permit/layout.lua
-- ARGV[1] request id   ARGV[2] the number of its unanswered call ("0" if none)
-- ARGV[3] the session id   ARGV[4] the session's low mark (see common.lua)
-- Returns: {"WITHDRAWN"}              (it was waiting; nothing was taken)
--        | {"RETURNED", permits}      (it had been granted; the permits were given back)
--        | {"UNKNOWN"}                (no such request, or already withdrawn)
--        | {"WRONGTYPE", key, actual, expected} | {"LAYOUT", key, found, ours}
local id, seq = ARGV[1], ARGV[2] or '0'
open_session(ARGV[3], ARGV[4])
-- withdraw_op() (permit/requests.lua, which permit_batch runs too), on the records read with
-- the request's and the session's, and settled: out of the queue, or what it was granted
-- given back (or what its unanswered call took); the call marked withdrawn; the queue
-- promoted.
return run(function()
  return withdraw_op(id, seq)
end, 'r:' .. id)
