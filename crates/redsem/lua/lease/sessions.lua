-- lease/sessions: a call marked in its client's session record (see common.lua).

-- Mark the caller's sequence number `seq` (text) with `mark` in its session record, and
-- raise the record's low mark to the caller's (S.low); a new or renewed record's expiry is
-- registered in leases (see prune()).
local function mark(seq, mark_letter)
  local name = S.sess
  local value, renewed = session_put(S.low, seq, mark_letter)
  put(name, value)
  if renewed then
    if call(LEASES, 'ZADD', LEASES, digits(-renewed), name) == 1 then
      put('nt', S.nt + 1)
    end
    if S.tnext == 0 then
      put('tnext', renewed)
    end
  end
end
