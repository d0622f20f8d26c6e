-- permit_try_set: set the count to PERMITS if it was never set (a count of 0 is set), then
-- hand permits to requests that queued before it was set.
-- Applied once per call: its number is marked in the client's session ("S"), and a resend
-- answers "SET" again.
-- KEYS: see permit/layout.lua
-- ARGV[1] request id (not used)   ARGV[2] permits (>= 0)   ARGV[3] this call's number in the
-- client's session   ARGV[4] the session id   ARGV[5] the session's low mark (common.lua)
-- Returns: {"SET"} | {"EXISTS", available} | {"WRONGTYPE", key, actual, expected}
--        | {"LAYOUT", key, found, ours}
local permits, seq = ARGV[2], ARGV[3] or '0'
open_session(ARGV[4], ARGV[5])
return run(function()
  if session_mark(seq) == 'S' then
    return { 'SET' }
  end
  if S.count or session_stale(seq) then
    return { 'EXISTS', S.count or 0 }
  end
  mark(seq, 'S')
  redis.call('SET', COUNT, permits)
  S.count = tonumber(permits)
  promote()
  return { 'SET' }
end)
