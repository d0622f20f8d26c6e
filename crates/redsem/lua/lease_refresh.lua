-- lease_refresh: extend the lease of a live permit to now + lease ms.
-- KEYS: see lease_prelude.lua
-- ARGV[1] permit id   ARGV[2] lease ms
-- Returns: {"OK"} | {"NOTHELD"} | {"WRONGTYPE", key, actual, expected}
return run(function()
  local id, lease = ARGV[1], tonumber(ARGV[2])
  load(id)
  if not S.cap then
    return { 'NOTHELD' }
  end
  local now = now_ms()
  settle(now)
  local r = record(id)
  if not (r and r.h) then
    save()
    return { 'NOTHELD' }
  end
  redis.call('ZADD', LEASES, now + lease, id)
  keep_alive(now + lease)
  save()
  return { 'OK' }
end)
