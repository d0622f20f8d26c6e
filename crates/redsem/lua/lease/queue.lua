-- lease/queue: waiters leave the queue, its head is read a window at a time and promoted.

-- A waiter leaves the queue: its entry and record go, qlen and its label counted down.
local function drop_waiter(id, r)
  S.heads = nil -- (perhaps inside the window peek() read: read it again)
  call(QUEUE, 'ZREM', QUEUE, id)
  put('r:' .. id, false)
  put('qlen', math.max(S.qlen - 1, 0))
  label_add(r.l, -1)
end

-- The window at the head of the queue, S.heads from S.at on: the first ids of the queue
-- (two, or one more than the releases of a batch: S.window), with their records read (one
-- HMGET for those this call has not read yet, instead of an HGET each as record() would).
-- Kept for the rest of the call: promote() takes its heads from the front, new waiters join
-- behind it, and whatever else removes a waiter (drop_waiter(), repair()) drops the window.
local function peek()
  local ids = call(QUEUE, 'ZRANGE', QUEUE, '0', text((S.window or 2) - 1))
  local names, n = {}, 0
  for i = 1, #ids do
    local name = 'r:' .. ids[i]
    if S[name] == nil then
      n = n + 1
      names[n] = name
    end
  end
  if n > 0 then
    local raws = call(STATE, 'HMGET', STATE, unpack(names, 1, n))
    for i = 1, n do
      S[names[i]] = raws[i]
    end
  end
  S.heads, S.at = ids, 1
end

-- Grant, in arrival order, every waiter at the head of the queue that now fits, and wake
-- exactly those: one message each on their client's channel,
-- "id|token|slot,slot|ms since its last check-in". A grant woken by message is unclaimed:
-- its lease entry keeps the end of the waiter lease of its last check-in (or a lease from
-- now, if that ends sooner), so a waiter that
-- died costs no more than that (settle then drops the grant like an expired holder). The
-- waiter's claim (its check-in, a renewal, a resent acquire) gives it its full lease from
-- then; the waiter counts the unclaimed grant from its last check-in, which is never later
-- than the server's. A grant handed back to the caller's own process (the local hand-off)
-- is claimed at once: its lease is the waiter's own lease, from now. Stops at the first
-- waiter that does not fit, so a large request is
-- never overtaken by smaller ones behind it, and when WORK_BUDGET is spent.
-- A waiter asking for more than the capacity is dropped and woken to learn it.
-- The queue is read a window at a time (see peek()): every step that goes on removes the
-- head, so the next id of the window is the next head, and a release that grants one
-- waiter looks at the next one without reading the queue again (nor does the next release
-- of a batch).
local function promote()
  while S.qlen > 0 and budget > 0 do
    if not (S.heads and S.heads[S.at]) then
      peek()
    end
    local head = S.heads[S.at]
    if not head then
      repair() -- qlen says someone waits, the queue is empty
      return
    end
    S.at = S.at + 1
    local w = record(head)
    if not w or w.h then
      redis.call('ZREM', QUEUE, head)
      put('qlen', math.max(S.qlen - 1, 0))
    elseif w.k > S.cap then
      drop_waiter(head, w)
      redis.call('ZREM', LEASES, head)
      wake(w.c, head)
    elseif S.used + w.k > S.cap then
      S.at = S.at - 1 -- (still the head)
      return
    else
      budget = budget - w.k
      local place_ends = tonumber(redis.call('ZSCORE', LEASES, head)) or (S.now + w.wl)
      local checked_in = place_ends - w.wl
      local mine = w.c == S.mine
      -- Unclaimed (woken by message): until its place would have ended, and never longer
      -- than its lease; at least a moment, so it is never due in this very call.
      local ends = S.now + w.lease
      if not mine then
        ends = max(min(place_ends, ends), S.now + 1)
      end
      local _, slots, token = grant(head, w.k, w.l, w.lease, ends)
      redis.call('ZREM', QUEUE, head)
      put('qlen', math.max(S.qlen - 1, 0))
      local listed = #slots == 1 and text(slots[1]) or table.concat(slots, ',')
      local grant_msg = head .. '|' .. token .. '|' .. listed .. '|' .. text(max(S.now - checked_in, 0))
      if mine then
        -- A waiter of the caller's own process: handed over with the reply, no PUBLISH.
        S.handed = S.handed or {}
        S.handed[#S.handed + 1] = grant_msg
      else
        wake(w.c, grant_msg)
      end
      if S.used >= S.cap then
        -- Full again: no waiter fits, so the next head is not read now. (What promote()
        -- would still do there, see promote_left(), waits for the next unit freed.)
        return
      end
    end
  end
end

-- When to look again without a wake-up: the head waiter also when the first lease ends.
-- `behind`: the caller knows the waiter is not at the head (no ZRANK).
local function recheck_ms(id, waiter_lease, behind)
  local wait = math.floor(waiter_lease / 3)
  if S.next > 0 and not behind and redis.call('ZRANK', QUEUE, id) == 0 then
    wait = math.min(wait, S.next - S.now + 1)
  end
  return math.max(wait, 1)
end

-- Queue a new request `id` for `k` units behind everyone (its ticket the next of seq), with
-- its lease entry at the end of its waiter lease, its record and its label counted; the
-- QUEUED reply.
local function enqueue(id, k, lease, waiter_lease, channel, label)
  local position = S.qlen
  call(QUEUE, 'ZADD', QUEUE, digits(S.seq + 1), id)
  add_lease(id, S.now + waiter_lease)
  put('seq', S.seq + 1)
  put('qlen', position + 1)
  put('r:' .. id, waiter_record(k, lease, waiter_lease, channel, label))
  label_add(label, 1)
  -- Queued behind others (their tickets are lower): not the head.
  return { 'QUEUED', position, recheck_ms(id, waiter_lease, position > 0) }
end
