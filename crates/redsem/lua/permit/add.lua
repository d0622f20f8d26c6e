-- permit_add: add DELTA permits (a release, or add_permits; DELTA may be negative, and the
-- count may go below zero), then hand what is available to the head of the queue.
-- Applied once per call: its number is marked in the client's session, so a resend changes
-- nothing.
-- KEYS: see permit/layout.lua
-- ARGV[1] request id (not used: the call is named by its number)   ARGV[2] delta (integer)
-- ARGV[3] this call's number in the client's session   ARGV[4] the session id
-- ARGV[5] the session's low mark (see common.lua)
-- Returns: {"ADDED", available}
--        | {"REPEATED", available}   (this call was applied already)
--        | {"RANGE", available}      (the delta or the count would leave +-(2^53 - 1); nothing
--                                     changed)
--        | {"WRONGTYPE", key, actual, expected} | {"LAYOUT", key, found, ours}
-- With nobody waiting, fast_add (permit/fast.lua); else add_op() (permit/requests.lua, which
-- permit_batch runs too), on the records read and settled, the count read only if needed:
-- a call marked or late answers REPEATED; the count changed (RANGE if it would leave the
-- range) and the call marked; what is available handed to the head of the queue.
local request = { delta = ARGV[2], seq = ARGV[3] }
open_session(ARGV[4], ARGV[5])
return run(function()
  return add_op(request.delta, request.seq or '0')
end, nil, 'lazy', fast_add, request)
