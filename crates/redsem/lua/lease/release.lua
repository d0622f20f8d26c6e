-- lease_release: give back a permit ("r"), or withdraw a queued request ("w": a cancelled
-- acquire), and hand the freed units to the head of the queue. A holder's release marks its
-- sequence number in the client's session with its outcome, so the same release resent
-- after a lost reply answers as the first one did, and a release of an id that another call
-- released answers NOTHELD. A withdrawal names the sequence number of the request's enqueue
-- if that went unanswered ("0" if not): a late copy of it is then refused. Grants made to
-- waiters on the caller's own channel come back in the reply instead of by PUBLISH; a
-- release that leaves the semaphore idle leaves its TTL to lease_tidy (see the prelude).
-- KEYS: see lease/layout.lua
-- ARGV[1] permit or request id   ARGV[2] the caller's wake channel
-- ARGV[3] the sequence number: of this release ("r"), of the unanswered enqueue ("w")
-- ARGV[4] the session id   ARGV[5] the session's low mark   ARGV[6] "r" | "w"
-- Returns: {"RELEASED" | "DEQUEUED" | "NOTHELD", idle (1: send lease_tidy), "id|token|slots|delay", ...}
--          (after the idle flag, the grants made to waiters on the caller's channel)
--        | {"WRONGTYPE", key, actual, expected}
local request = { id = ARGV[1], seq = ARGV[3], kind = ARGV[6] }
S.mine, S.defer_idle = ARGV[2], true
open_session(ARGV[4], ARGV[5])
-- A holder's release of one unit with nobody queued takes fast_release (lease/fast.lua);
-- every other goes by release() (lease/requests.lua, which lease_batch runs too), on the
-- state read with the id's record and the session's, and settled; the reply says whether
-- the semaphore is left idle.
return run(function()
  local outcome = release(request)
  return released(outcome, needs_idle_ttl())
end, 'r:' .. request.id, nil, fast_release, request)
