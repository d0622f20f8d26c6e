-- lease_batch: the group commit of one client on one semaphore: the acquires and releases
-- its tasks have in flight, applied in the order given with the outcomes each would have
-- had one by one, on one read of the time and the state and one write-back (the cost of a
-- call is mostly what every call does: the dispatch, TIME, the state's HMGET, the HSET).
-- KEYS: see lease/layout.lua
-- ARGV[1] the caller's wake channel   ARGV[2] its session id   ARGV[3] the session's low
-- mark, then the operations one after another:
--   "a", request id, capacity, units k, lease ms, label, "1" | "0", "try" | "wait",
--        waiter lease ms, sequence number                  (as lease_acquire, same channel)
--   "r" | "w", permit or request id, sequence number       (as lease_release)
-- Returns: {{reply of each operation, in order}, idle (1: send lease_tidy),
--           "id|token|slots|delay", ... (grants to waiters on the caller's channel)}
--        an acquire's reply as lease_acquire's; a release's {"RELEASED" | "DEQUEUED" | "NOTHELD"}
--        | {"WRONGTYPE", key, actual, expected} | {"LAYOUT", found, ours} (for all of them)
local names, n, releases = {}, 0, 0
local i = 4
while i <= #ARGV do
  n = n + 1
  names[n] = 'r:' .. ARGV[i + 1]
  if ARGV[i] == 'a' then
    i = i + 10
  elseif ARGV[i] == 'r' or ARGV[i] == 'w' then
    releases, i = releases + 1, i + 3
  else
    -- (Checked before anything is applied: a batch is applied whole or not at all.)
    return redis.error_reply('lease_batch: unknown operation ' .. tostring(ARGV[i]))
  end
end
S.sess, S.low = 's:' .. (ARGV[2] or ''), seqno(ARGV[3])
names[n + 1] = S.sess
-- Each release may hand its units to the head of the queue: read that many heads at once.
S.mine, S.window = ARGV[1], releases + 1
return run(function()
  local replies, at, j = {}, 4, 0
  while at <= #ARGV do
    j = j + 1
    if ARGV[at] == 'a' then
      replies[j] = acquire_op(ARGV, at, ARGV[1], ARGV[at + 9])
      at = at + 10
    else
      S.defer_idle = true
      replies[j] = { release_op(ARGV[at + 1], ARGV[at + 2], ARGV[at]) }
      at = at + 3
    end
  end
  return released(replies, S.defer_idle and needs_idle_ttl())
end, names)
