-- lease_acquire: grant K units to a new request now, or (mode "wait") queue it.
-- KEYS: see lease_prelude.lua
-- ARGV[1] request id   ARGV[2] capacity   ARGV[3] units k   ARGV[4] lease ms
-- ARGV[5] label ("" for none)   ARGV[6] "1" = one live request per label
-- ARGV[7] mode "try" | "wait"   ARGV[8] waiter lease ms   ARGV[9] wake channel
-- Returns: {"GRANTED", token, {slots}}
--        | {"QUEUED", position, recheck ms}          (mode "wait" only)
--        | {"BUSY", units in use, waiters}           (mode "try": no room, or others wait)
--        | {"CONFLICT", capacity in force}           (a different capacity while in use)
--        | {"LABEL", label}                          (the label already holds or awaits one)
--        | {"TOOBIG", capacity}                      (k larger than the capacity in force)
--        | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local id, cap, k, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local label, exclusive, mode = ARGV[5], ARGV[6] == '1', ARGV[7]
local waiter_lease, channel = tonumber(ARGV[8]), ARGV[9]
local now = now_ms()

local stored = stored_cap()
if stored then
  settle(now, stored)
end
if stored ~= cap then
  if stored and (meta_num('used') > 0 or redis.call('ZCARD', QUEUE) > 0) then
    return { 'CONFLICT', stored }
  end
  redis.call('HSET', META, 'cap', cap)
  rebuild_free(cap)
end
if k > cap then
  return { 'TOOBIG', cap }
end
if exclusive and label ~= '' and meta_num('label:' .. label) > 0 then
  return { 'LABEL', label }
end

local used = meta_num('used')
local waiting = redis.call('ZCARD', QUEUE)
if waiting == 0 and used + k <= cap then
  local token, slots = grant(id, k, label, now + lease, now)
  label_add(label, 1)
  touch(now)
  return { 'GRANTED', token, slots }
end
if mode ~= 'wait' then
  return { 'BUSY', used, waiting }
end

local ticket = redis.call('HINCRBY', META, 'seq', 1)
redis.call('ZADD', QUEUE, ticket, id)
redis.call('ZADD', WAITERS, now + waiter_lease, id)
redis.call('HSET', RECORDS, id, cjson.encode({ k = k, l = label, c = channel, w = now }))
label_add(label, 1)
touch(now)
return { 'QUEUED', waiting, recheck_ms(now, id, waiter_lease) }
