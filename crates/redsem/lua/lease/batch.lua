-- lease_batch: the group commit of one client on one semaphore: the acquires and releases
-- its tasks have in flight, applied in the order given with the outcomes each would have
-- had one by one, on one read of the time and the state and one write-back (the cost of a
-- call is mostly what every call does: the dispatch, TIME, the state's HMGET, the HSET).
-- KEYS: see lease/layout.lua
-- ARGV[1] the caller's wake channel   ARGV[2] its session id   ARGV[3] the session's low
-- mark, then the operations one after another:
--   "a", request id, capacity, units k, lease ms, label, "1" | "0", "try" | "wait",
--        waiter lease ms, sequence number, tenant, weight, cap
--                                                          (as lease_acquire, same channel)
--   "r" | "w", permit or request id, sequence number       (as lease_release)
-- Returns: {{reply of each operation, in order}, idle (1: send lease_tidy),
--           "id|token|slots|delay", ... (grants to waiters on the caller's channel)}
--        an acquire's reply as lease_acquire's; a release's {"RELEASED" | "DEQUEUED" | "NOTHELD"}
--        | {"WRONGTYPE", key, actual, expected} | {"LAYOUT", found, ours} (for all of them)
local channel, session, low = ARGV[1], ARGV[2], ARGV[3]
-- The operations, named, and the fields read up front: their records, then the session's.
-- (Checked before anything is applied: a batch is applied whole or not at all.)
local requests, names, n, releases = {}, {}, 0, 0
local i = 4
while i <= #ARGV do
  n = n + 1
  names[n] = 'r:' .. ARGV[i + 1]
  if ARGV[i] == 'a' then
    requests[n] = {
      kind = 'a', id = ARGV[i + 1], cap = ARGV[i + 2], k = ARGV[i + 3], lease = ARGV[i + 4], label = ARGV[i + 5],
      exclusive = ARGV[i + 6], mode = ARGV[i + 7], waiter_lease = ARGV[i + 8], channel = channel, seq = ARGV[i + 9],
      tenant = ARGV[i + 10], weight = ARGV[i + 11], tcap = ARGV[i + 12],
    }
    i = i + 13
  elseif ARGV[i] == 'r' or ARGV[i] == 'w' then
    requests[n] = { kind = ARGV[i], id = ARGV[i + 1], seq = ARGV[i + 2] }
    releases, i = releases + 1, i + 3
  else
    return redis.error_reply('lease_batch: unknown operation ' .. tostring(ARGV[i]))
  end
end
open_session(session, low)
names[n + 1] = S.sess
-- Each release may hand its units to the head of the queue: read that many heads at once.
S.mine, S.window = channel, releases + 1
-- Each operation in order, as acquire() and release() (lease/requests.lua) apply it alone;
-- the releases leave the idle TTL to lease_tidy, as lease_release does.
return run(function()
  local replies = {}
  for j, request in ipairs(requests) do
    if request.kind == 'a' then
      replies[j] = acquire(request)
    else
      S.defer_idle = true
      replies[j] = { release(request) }
    end
  end
  return released(replies, S.defer_idle and needs_idle_ttl())
end, names)
