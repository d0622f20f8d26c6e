-- permit_acquire: take K permits for a new request now, or (mode "wait") queue it.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id   ARGV[2] permits k (>= 1)   ARGV[3] mode "try" | "wait"
-- ARGV[4] waiter lease ms   ARGV[5] wake channel
-- Returns: {"GRANTED"}
--        | {"QUEUED", position, recheck ms}          (mode "wait" only)
--        | {"BUSY", available, waiters}              (mode "try": too few, or others wait)
--        | {"GONE"}                                  (the id was withdrawn, or its place lost)
--        | {"WRONGTYPE", key, actual, expected}
-- A repeated id (a resend after a lost reply) answers as a poll would: the same request is
-- never granted or queued twice. A new wait request is never granted past the queue, and
-- never granted more than the count holds.
local name = 'r:' .. ARGV[1]
return run(function()
  local id, k, mode = ARGV[1], tonumber(ARGV[2]), ARGV[3]
  local lease, channel = tonumber(ARGV[4]), ARGV[5]
  if S[name] then
    return check_in(id, lease)
  end

  local count, position = S.count or 0, S.qlen
  if position == 0 and count >= k then
    remember(name)
    add(-k)
    put(name, 'c|' .. ARGV[2])
    return { 'GRANTED' }
  end
  if mode ~= 'wait' then
    return { 'BUSY', count, position }
  end

  -- Each write is counted in records as soon as it is made, so a foreign value found at the
  -- next key leaves nothing uncounted.
  local reply = queued(id, lease, position)
  local ticket = call(META, 'HINCRBY', META, 'seq', 1)
  S.fresh_meta = ticket == 1
  call(QUEUE, 'ZADD', QUEUE, ticket, id)
  S.fresh_queue = position == 0
  put('qlen', position + 1)
  put(name, string.format('w|%d|%d|%s', k, S.now, channel))
  return reply
end, name)
