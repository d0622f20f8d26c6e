-- lease_tidy: give an idle semaphore's keys their TTL (KEEP_IDLE_MS). Sent by a client a
-- moment after a release answered IDLE; does nothing if the semaphore is live again (its
-- keys must carry no TTL then) or already has the TTL.
-- KEYS: see lease/layout.lua
-- ARGV: none
-- Returns: {"OK"} | {"WRONGTYPE", key, actual, expected}
return run(function()
  return { 'OK' }
end, nil, 'unsettled')
