-- lease_poll: a queued request checks in. Renews its place in the queue, or, if it was
-- granted while it waited, starts its lease now and collects the grant.
-- KEYS: see lease_prelude.lua
-- ARGV[1] request id   ARGV[2] lease ms   ARGV[3] waiter lease ms
-- Returns: {"GRANTED", token, {slots}}
--        | {"QUEUED", position, recheck ms}
--        | {"GONE"}            (neither queued nor granted: evicted, or dropped by a capacity change)
--        | {"WRONGTYPE", key, actual, expected}
return run(function()
  local id, lease, waiter_lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
  load(id)
  if not S.cap then
    return { 'GONE' }
  end
  local now = now_ms()
  settle(now)

  local r = record(id)
  if not r then
    save()
    return { 'GONE' }
  end
  local ends = now + (r.h and lease or waiter_lease)
  redis.call('ZADD', LEASES, ends, id)
  keep_alive(ends)
  save()
  if r.h then
    return { 'GRANTED', r.t, r.s }
  end
  return { 'QUEUED', redis.call('ZRANK', QUEUE, id), recheck_ms(now, id, waiter_lease) }
end)
