-- lease_release: give back a permit, or withdraw a queued request (a cancelled acquire),
-- and hand the freed units to the head of the queue.
-- KEYS: see lease_prelude.lua
-- ARGV[1] permit or request id
-- Returns: {"RELEASED"} | {"DEQUEUED"} | {"NOTHELD"} | {"WRONGTYPE", key, actual, expected}
return run(function()
  local id = ARGV[1]
  load(id)
  if not S.cap then
    return { 'NOTHELD' }
  end
  local now = now_ms()
  settle(now)
  local r = record(id)
  local outcome = 'NOTHELD'
  if r and r.h then
    drop_holder(id, r)
    outcome = 'RELEASED'
  elseif r then
    drop_waiter(id, r)
    outcome = 'DEQUEUED'
  end
  promote(now)
  save()
  return { outcome }
end)
