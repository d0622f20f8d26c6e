-- lease_status: a snapshot of a lease semaphore, after dropping what has expired.
-- KEYS: see lease_prelude.lua
-- ARGV: none
-- Returns: {"STATUS", capacity (-1 if none stored), units in use,
--           {{id, label, token, lease ms left, held for ms, {slots}}, ...}   (grant order)
--           {{id, label, k, waiting for ms}, ...}}                         (queue order)
--        | {"WRONGTYPE", key, actual, expected}
local bad = foreign_key()
if bad then
  return bad
end
local now = now_ms()
local cap = stored_cap()
if cap then
  settle(now, cap)
end

local holders = {}
local ids = redis.call('ZRANGE', HOLDERS, 0, -1, 'WITHSCORES')
for i = 1, #ids, 2 do
  local raw = redis.call('HGET', RECORDS, ids[i])
  if raw then
    local r = cjson.decode(raw)
    holders[#holders + 1] = { ids[i], r.l, r.t, tonumber(ids[i + 1]) - now, now - r.a, r.s }
  end
end
table.sort(holders, function(a, b) return a[3] < b[3] end)

local waiters = {}
for _, id in ipairs(redis.call('ZRANGE', QUEUE, 0, -1)) do
  local raw = redis.call('HGET', RECORDS, id)
  if raw then
    local w = cjson.decode(raw)
    waiters[#waiters + 1] = { id, w.l, w.k, now - w.w }
  end
end
return { 'STATUS', cap or -1, meta_num('used'), holders, waiters }
