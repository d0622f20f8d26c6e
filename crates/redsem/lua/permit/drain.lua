-- permit_drain: take every available permit. A count at or below zero is left as it is.
-- Applied once per call: its number is marked in the client's session with the amount taken
-- ("D<n>"), and a resend takes nothing more and answers that amount.
-- KEYS: see permit/layout.lua
-- ARGV[1] request id (not used)   ARGV[2] this call's number in the client's session
-- ARGV[3] the session id   ARGV[4] the session's low mark (see common.lua)
-- Returns: {"DRAINED", permits taken} | {"WRONGTYPE", key, actual, expected}
--        | {"LAYOUT", key, found, ours}
local seq = ARGV[2] or '0'
open_session(ARGV[3], ARGV[4])
return run(function()
  if session_stale(seq) then
    return { 'DRAINED', 0 }
  end
  local m = session_mark(seq)
  if m and string.sub(m, 1, 1) == 'D' then
    return { 'DRAINED', tonumber(string.sub(m, 2)) or 0 }
  end
  local count = S.count or 0
  if count <= 0 then
    mark(seq, 'D0')
    return { 'DRAINED', 0 }
  end
  -- Exactly 0, whatever was given back on the way.
  redis.call('SET', COUNT, 0)
  S.count, S.taken, S.create_count = 0, 0, false
  mark(seq, string.format('D%d', count))
  return { 'DRAINED', count }
end)
