-- lease_release: give back a permit, or withdraw a queued request (a cancelled acquire),
-- and hand the freed units to the head of the queue. The id is remembered for a minute with
-- the release attempt that released it, so the same release resent after a lost reply
-- answers as the first one did. A holder's release names its attempt: for an id released
-- by another attempt (someone's release by id) it answers NOTHELD; a release without an
-- attempt ("") is answered by whichever release made the tombstone. Grants made to
-- waiters on the caller's own channel come back in the reply instead of by PUBLISH; a
-- release that leaves the semaphore idle leaves its TTL to lease_tidy (see the prelude).
-- KEYS: see lease_prelude.lua
-- ARGV[1] permit or request id   ARGV[2] the caller's wake channel
-- ARGV[3] the release attempt: an id of this release, the same in its resend ("" for none)
-- Returns: {"RELEASED" | "DEQUEUED" | "NOTHELD", idle (1: send lease_tidy), "id|token|slots|delay", ...}
--          (after the idle flag, the grants made to waiters on the caller's channel)
--        | {"WRONGTYPE", key, actual, expected}
-- (The body is release_op, in lease_prelude.lua: lease_batch runs it too.)
S.mine, S.defer_idle = ARGV[2], true
-- (A holder's release with nobody queued takes fast_release, in lease_prelude.lua.)
return run(function()
  local outcome = release_op(ARGV[1], ARGV[3])
  return released(outcome, needs_idle_ttl())
end, 'r:' .. ARGV[1], nil, fast_release, ARGV)
