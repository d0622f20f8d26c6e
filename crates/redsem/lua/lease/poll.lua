-- lease_poll: a queued request checks in. Renews its place in the queue, or, if it was
-- granted while it waited, renews the grant's lease from now and collects the grant.
-- KEYS: see lease/layout.lua
-- ARGV[1] request id   ARGV[2] lease ms   ARGV[3] waiter lease ms
-- Returns: {"GRANTED", token, slot, slot, ...}
--        | {"QUEUED", position, recheck ms}
--        | {"GONE"}   (neither queued nor granted: its lease ran out, it was withdrawn, the
--                      capacity shrank below it, or the state was lost)
--        | {"WRONGTYPE", key, actual, expected}
local id, lease, waiter_lease = ARGV[1], number(ARGV[2]), number(ARGV[3])
-- In order: GONE without a state or a record; a waiter without its place in the queue is
-- GONE (the counters repaired); its lease entry renewed (a holder's lease, or a waiter's);
-- a grant collected (GRANTED), or its place (QUEUED).
return run(function()
  if not S.cap then
    return { 'GONE' }
  end

  local r = record(id)
  if not r then
    return { 'GONE' }
  end
  local rank
  if not r.h then
    rank = waiter_rank(id, r)
    if not rank then
      repair() -- a waiter record without its place in the queue
      return { 'GONE' }
    end
  end
  if add_lease(id, S.now + (r.h and lease or waiter_lease)) == 1 then
    check() -- its lease entry was missing
  end
  if r.h then
    return granted(tonumber(r.t), r.s)
  end
  return { 'QUEUED', rank, recheck_ms(id, waiter_lease, false, rank) }
end, 'r:' .. id)
