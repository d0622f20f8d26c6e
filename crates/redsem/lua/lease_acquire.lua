-- lease_acquire: grant K units to a new request now, or (mode "wait") queue it. A request id
-- seen before (the same request, resent after a lost reply) is answered as by lease_poll.
-- KEYS: see lease_prelude.lua
-- ARGV[1] request id   ARGV[2] capacity   ARGV[3] units k   ARGV[4] lease ms
-- ARGV[5] label ("" for none)   ARGV[6] "1" = one live request per label
-- ARGV[7] mode "try" | "wait"   ARGV[8] waiter lease ms   ARGV[9] wake channel
-- Returns: {"GRANTED", token, {slots}}
--        | {"QUEUED", position, recheck ms}          (mode "wait" only)
--        | {"BUSY", units in use, waiters}           (mode "try": no room, or others wait)
--        | {"GONE"}                                  (this id was released or withdrawn)
--        | {"CONFLICT", capacity in force}           (a different capacity while in use)
--        | {"LABEL", label}                          (the label already holds or awaits one)
--        | {"TOOBIG", capacity}                      (k larger than the capacity in force)
--        | {"TOOMANY", most units per request}
--        | {"WRONGTYPE", key, actual, expected}
if tonumber(ARGV[3]) > MAX_UNITS then
  return { 'TOOMANY', MAX_UNITS }
end
return run(function()
  local id, cap, k, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local label, exclusive, mode = ARGV[5], ARGV[6] == '1', ARGV[7]
  local waiter_lease, channel = tonumber(ARGV[8]), ARGV[9]
  local mine = record(id)
  if mine and mine.x then
    return { 'GONE' }
  elseif mine then
    -- Resent: answer as the first attempt did, renewing what it got.
    add_lease(id, S.now + (mine.h and lease or waiter_lease))
    if mine.h then
      return { 'GRANTED', mine.t, mine.s }
    end
    return { 'QUEUED', redis.call('ZRANK', QUEUE, id) or 0, recheck_ms(id, waiter_lease) }
  end

  if S.cap ~= cap then
    if S.cap and (S.used > 0 or S.qlen > 0) then
      return { 'CONFLICT', S.cap }
    end
    set_cap(cap)
  end
  if k > cap then
    return { 'TOOBIG', cap }
  end
  if exclusive and label ~= '' and (tonumber(field('label:' .. label)) or 0) > 0 then
    return { 'LABEL', label }
  end

  if not (S.qlen == 0 and S.used + k <= cap) and check() then
    promote()
  end
  if S.qlen == 0 and S.used + k <= cap then
    local token, slots = grant(id, k, label, lease, S.now + lease)
    label_add(label, 1)
    return { 'GRANTED', token, slots }
  end
  if mode ~= 'wait' then
    return { 'BUSY', S.used, S.qlen }
  end

  local position = S.qlen
  call(QUEUE, 'ZADD', QUEUE, S.seq + 1, id)
  add_lease(id, S.now + waiter_lease)
  put('seq', S.seq + 1)
  put('qlen', position + 1)
  put('r:' .. id, waiter_record(k, S.now, lease, waiter_lease, channel, label))
  label_add(label, 1)
  -- Queued behind others (their tickets are lower): not the head.
  return { 'QUEUED', position, recheck_ms(id, waiter_lease, position > 0) }
end, 'r:' .. ARGV[1])
