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
return run(function()
  local id, cap, k, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local label, exclusive, mode = ARGV[5], ARGV[6] == '1', ARGV[7]
  local waiter_lease, channel = tonumber(ARGV[8]), ARGV[9]
  load()
  local now = now_ms()

  if S.cap then
    settle(now)
  end
  if S.cap ~= cap then
    if S.cap and (S.used > 0 or S.qlen > 0) then
      local current = S.cap
      save()
      return { 'CONFLICT', current }
    end
    set_cap(cap)
  end
  if k > cap then
    save()
    return { 'TOOBIG', cap }
  end
  if exclusive and label ~= '' and (tonumber(field('label:' .. label)) or 0) > 0 then
    save()
    return { 'LABEL', label }
  end

  if S.qlen == 0 and S.used + k <= cap then
    local token, slots = grant(id, k, label, now + lease, now)
    label_add(label, 1)
    keep_alive(now + lease)
    save()
    return { 'GRANTED', token, slots }
  end
  if mode ~= 'wait' then
    local used, waiting = S.used, S.qlen
    save()
    return { 'BUSY', used, waiting }
  end

  local position = S.qlen
  call(QUEUE, 'ZADD', QUEUE, S.seq + 1, id)
  if position == 0 then
    created(QUEUE)
  end
  add_lease(id, now + waiter_lease)
  put('seq', S.seq + 1)
  put('qlen', position + 1)
  put('r:' .. id, waiter_record(k, now, channel, label))
  label_add(label, 1)
  keep_alive(now + waiter_lease)
  save()
  return { 'QUEUED', position, recheck_ms(now, id, waiter_lease) }
end)
