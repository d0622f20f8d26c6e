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
-- (The body is release_op, in lease/requests.lua: lease_batch runs it too.)
S.mine, S.defer_idle = ARGV[2], true
S.sess, S.low = 's:' .. (ARGV[4] or ''), seqno(ARGV[5])
-- (A holder's release with nobody queued takes fast_release, in lease/fast.lua.)
return run(function()
  local outcome = release_op(ARGV[1], ARGV[3], ARGV[6])
  return released(outcome, needs_idle_ttl())
end, 'r:' .. ARGV[1], nil, fast_release, ARGV)
