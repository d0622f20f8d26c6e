-- permit_acquire: take K permits for a new request now, or (mode "wait") queue it.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id   ARGV[2] permits k (>= 1)   ARGV[3] mode "try" | "wait"
-- ARGV[4] waiter lease ms   ARGV[5] wake channel
-- Returns: {"GRANTED"}
--        | {"QUEUED", position, recheck ms}          (mode "wait" only)
--        | {"BUSY", available, waiters}              (mode "try": too few, or others wait)
--        | {"GONE"}                                  (the id was withdrawn)
--        | {"WRONGTYPE", key, actual, expected}
-- A repeated id answers as a poll would: the same request is never granted twice.
local bad = foreign_key()
if bad then
  return bad
end
local id, k, mode = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local waiter_lease, channel = tonumber(ARGV[4]), ARGV[5]
local now = now_ms()
settle(now)

local raw = redis.call('HGET', RECORDS, id)
if raw then
  return check_in(id, cjson.decode(raw), now, waiter_lease)
end

local count = available()
local waiting = redis.call('ZCARD', QUEUE)
if waiting == 0 and count >= k then
  redis.call('DECRBY', COUNT, k)
  remember(id, { s = 'c', k = k }, now)
  touch(now)
  return { 'GRANTED' }
end
if mode ~= 'wait' then
  return { 'BUSY', count, waiting }
end

local ticket = redis.call('HINCRBY', META, 'seq', 1)
redis.call('ZADD', QUEUE, ticket, id)
redis.call('ZADD', WAITERS, now + waiter_lease, id)
redis.call('HSET', RECORDS, id, cjson.encode({ s = 'w', k = k, c = channel, w = now }))
touch(now)
return { 'QUEUED', waiting, recheck_ms(waiter_lease) }
