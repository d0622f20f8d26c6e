-- permit_acquire: take K permits for a new request now, or (mode "wait") queue it.
-- KEYS: see permit/layout.lua
-- ARGV[1] request id   ARGV[2] permits k (>= 1)   ARGV[3] mode "try" | "wait"
-- ARGV[4] waiter lease ms   ARGV[5] wake channel   ARGV[6] this call's number in the
-- client's session   ARGV[7] the session id   ARGV[8] the session's low mark (common.lua)
-- Returns: {"GRANTED"}
--        | {"QUEUED", position, recheck ms}          (mode "wait" only)
--        | {"BUSY", available, waiters}              (mode "try": too few, or others wait)
--        | {"GONE"}                                  (withdrawn, its place lost, or a late copy)
--        | {"WRONGTYPE", key, actual, expected} | {"LAYOUT", key, found, ours}
-- A resend (the same id and number, after a lost reply) answers as a poll would: the same
-- request is never granted or queued twice. A new wait request is never granted past the
-- queue, and never granted more than the count holds.
-- A new request that the count holds, with nobody waiting, takes fast_acquire
-- (permit/fast.lua); every other goes by acquire_op() (permit/requests.lua, which
-- permit_batch runs too), on the records read with the request's and the session's, and
-- settled: a late copy is GONE, a call marked answers as it did, a known id checks in; then
-- granted now if nobody waits and the count holds k, else BUSY, or (mode "wait") queued.
local request = {
  id = ARGV[1], k = ARGV[2], mode = ARGV[3], waiter_lease = ARGV[4], channel = ARGV[5], seq = ARGV[6],
}
open_session(ARGV[7], ARGV[8])
return run(function()
  return acquire_op(request.id, request.k, request.mode, tonumber(request.waiter_lease), request.channel,
    request.seq or '0')
end, 'r:' .. request.id, nil, fast_acquire, request)
