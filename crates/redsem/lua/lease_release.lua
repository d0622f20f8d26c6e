-- lease_release: give back a permit, or withdraw a queued request (a cancelled acquire),
-- and hand the freed units to the head of the queue. The id is remembered for a minute, so
-- the same release resent after a lost reply answers as the first one did.
-- KEYS: see lease_prelude.lua
-- ARGV[1] permit or request id
-- Returns: {"RELEASED"} | {"DEQUEUED"} | {"NOTHELD"} | {"WRONGTYPE", key, actual, expected}
return run(function()
  local id = ARGV[1]
  load(id)
  if not S.cap then
    return { 'NOTHELD' }
  end
  settle()
  local r = record(id)
  if r and r.x then
    return { r.x == 'D' and 'DEQUEUED' or 'RELEASED' }
  end
  local outcome = 'NOTHELD'
  if r and r.h then
    drop_holder(id, r)
    bury(id, 'R')
    outcome = 'RELEASED'
  elseif r then
    drop_waiter(id, r)
    bury(id, 'D')
    outcome = 'DEQUEUED'
  end
  promote()
  return { outcome }
end)
