-- permit/sessions: a call marked in its client's session record (see common.lua), and the
-- permits a marked call took.

-- Mark the call numbered `seq` (text) `mark` in the caller's session record (see
-- common.lua); a new or renewed record's expiry goes to sessions, and keep covers it.
local function mark(seq, mark_text)
  local value, renewed = session_put(S.low, seq, mark_text)
  put(S.sess, value)
  if renewed then
    call(APPLIED, 'ZADD', APPLIED, digits(renewed), S.sess)
    S.fresh_applied = true
    if not S.prune then
      put('prune', renewed + PRUNE_EVERY_MS)
    end
    if renewed > S.need then
      S.need = renewed
    end
  end
end

-- The mark of the call numbered `seq` if it is one of permits taken ("G<k>"): k; else nil.
local G = 71 -- the byte of 'G'
local function taken_by(seq)
  local m = session_mark(seq)
  return m and byte(m, 1) == G and (tonumber(string.sub(m, 2)) or 0) or nil
end
