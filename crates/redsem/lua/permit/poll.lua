-- permit_poll: a queued request checks in. Renews its place in the queue, or, if permits
-- were handed to it while it waited, collects them.
-- KEYS: see permit/layout.lua
-- ARGV[1] request id   ARGV[2] waiter lease ms   ARGV[3] this check-in's number in the
-- client's session   ARGV[4] the session id   ARGV[5] the session's low mark (common.lua)
-- Returns: {"GRANTED"}                       (also when resent after a collection)
--        | {"QUEUED", position, recheck ms}
--        | {"GONE"}        (neither queued nor granted: its waiter lease ended, it was withdrawn,
--                           or its record or place in the queue was lost; the caller queues
--                           again under a new request id)
--        | {"WRONGTYPE", key, actual, expected} | {"LAYOUT", key, found, ours}
local id, waiter_lease, seq = ARGV[1], tonumber(ARGV[2]), ARGV[3] or '0'
open_session(ARGV[4], ARGV[5])
-- check_in() (permit/requests.lua, which permit_batch runs too), on the records read with
-- the request's and the session's, and settled: a grant collected (the call marked with the
-- permits taken), a wait renewed, or GONE.
return run(function()
  return check_in(id, waiter_lease, seq)
end, 'r:' .. id)
