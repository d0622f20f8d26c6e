-- permit_acquire: take K permits for a new request now, or (mode "wait") queue it.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id   ARGV[2] permits k (>= 1)   ARGV[3] mode "try" | "wait"
-- ARGV[4] waiter lease ms   ARGV[5] wake channel
-- Returns: {"GRANTED"}
--        | {"QUEUED", position, recheck ms}          (mode "wait" only)
--        | {"BUSY", available, waiters}              (mode "try": too few, or others wait)
--        | {"GONE"}                                  (the id was withdrawn, or its place lost)
--        | {"WRONGTYPE", key, actual, expected}
-- A repeated id (a resend after a lost reply) answers as a poll would: the same request is
-- never granted or queued twice. A new wait request is never granted past the queue, and
-- never granted more than the count holds.
-- (A new request that the count holds, with nobody waiting, takes fast_acquire, in
-- permit_prelude.lua.)
return run(function()
  return acquire_op(ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5])
end, 'r:' .. ARGV[1], nil, fast_acquire, ARGV)
