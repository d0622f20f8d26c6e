-- lease/queue: waiters leave the queue, its head is read a window at a time and promoted.

-- A waiter leaves the queue (a named tenant's, tqueue): its entry and record go, qlen, its
-- label and (with tenants) its tenant's waiters counted down.
local function drop_waiter(id, r)
  S.heads = nil -- (perhaps inside the window peek() read: read it again)
  if r.tn then
    call(TQUEUE, 'ZREM', TQUEUE, tq_member(r.tn, r.tk, id))
  else
    call(QUEUE, 'ZREM', QUEUE, id)
  end
  put('r:' .. id, false)
  put('qlen', math.max(S.qlen - 1, 0))
  label_add(r.l, -1)
  if S.tmode then
    tenant_add(r.tn or '', 0, -1)
  end
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
local function grant_waiter(head, w)
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
  local _, slots, token = grant(head, w.k, w.l, w.lease, ends, w.tn)
  local listed = #slots == 1 and text(slots[1]) or table.concat(slots, ',')
  local grant_msg = head .. '|' .. token .. '|' .. listed .. '|' .. text(max(S.now - checked_in, 0))
  if mine then
    -- A waiter of the caller's own process: handed over with the reply, no PUBLISH.
    S.handed = S.handed or {}
    S.handed[#S.handed + 1] = grant_msg
  else
    wake(w.c, grant_msg)
  end
end

-- promote() with tenants: the turn (the tenant with the lowest held / weight among those
-- waiting whose head fits their cap; ties: the earliest head) is granted its head, if that
-- fits in the free units, again and again; if it does not fit, nobody is granted (the turn is
-- never overtaken). Each grant is O(log tenants): the turn read, its head read, the tenant
-- listed again under its new score (tenant_add). False if the tenants went meanwhile (the
-- plain FIFO goes on).
local function promote_turns()
  while S.qlen > 0 and budget > 0 do
    if not S.tmode then
      return false
    end
    local top = call(TENANTS, 'ZRANGE', TENANTS, '0', '0')[1]
    if not top then
      return true -- (everyone waiting is at its cap)
    end
    local tenant = string.sub(top, 17)
    local head, ticket = tenant_head(tenant)
    local w = head and record(head)
    if not head then
      repair() -- listed as waiting, nobody waits
      return true
    elseif not w or w.h or (w.tn or '') ~= tenant then
      -- An entry without its waiter record: it goes.
      if tenant == '' then
        redis.call('ZREM', QUEUE, head)
      else
        redis.call('ZREM', TQUEUE, tq_member(tenant, ticket_text(ticket), head))
      end
      put('qlen', math.max(S.qlen - 1, 0))
      tenant_add(tenant, 0, -1)
    elseif w.k > S.cap then
      drop_waiter(head, w)
      redis.call('ZREM', LEASES, head)
      wake(w.c, head)
    elseif S.used + w.k > S.cap then
      return true
    else
      grant_waiter(head, w)
      if w.tn then
        redis.call('ZREM', TQUEUE, tq_member(w.tn, w.tk, head))
      else
        redis.call('ZREM', QUEUE, head)
      end
      put('qlen', math.max(S.qlen - 1, 0))
      tenant_add(tenant, w.k, -1)
      if S.used >= S.cap then
        return true
      end
    end
  end
  return true
end

local function promote()
  if S.tmode and promote_turns() then
    return
  end
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
      grant_waiter(head, w)
      redis.call('ZREM', QUEUE, head)
      put('qlen', math.max(S.qlen - 1, 0))
      if S.used >= S.cap then
        -- Full again: no waiter fits, so the next head is not read now. (What promote()
        -- would still do there, see promote_left(), waits for the next unit freed.)
        return
      end
    end
  end
end

-- When to look again without a wake-up: the head waiter also when the first lease ends.
-- `behind`: the caller knows the waiter is not at the head (no ZRANK); `rank`: the caller
-- knows its place (a named tenant's waiter: in its tenant's queue).
local function recheck_ms(id, waiter_lease, behind, rank)
  local wait = math.floor(waiter_lease / 3)
  if S.next > 0 and not behind and (rank or redis.call('ZRANK', QUEUE, id)) == 0 then
    wait = math.min(wait, S.next - S.now + 1)
  end
  return math.max(wait, 1)
end

-- Queue a new request `id` for `k` units behind everyone (its ticket the next of seq), with
-- its lease entry at the end of its waiter lease, its record and its label counted; the
-- QUEUED reply.
-- With tenants, `tenant` names its tenant ("" the default one, whose queue is `queue`; a named
-- one's is its range of tqueue), and the position is in its tenant's queue.
local function enqueue(id, k, lease, waiter_lease, channel, label, tenant)
  local position, t = S.qlen, S.tmode and tenant_get(tenant)
  if t then
    position = t.wait
  end
  local record = waiter_record(k, lease, waiter_lease, channel, label)
  if tenant and tenant ~= '' then
    local ticket = ticket_text(S.seq + 1)
    call(TQUEUE, 'ZADD', TQUEUE, '0', tq_member(tenant, ticket, id))
    record = 'T' .. text(#tenant) .. '|' .. tenant .. ticket .. record
  else
    call(QUEUE, 'ZADD', QUEUE, digits(S.seq + 1), id)
  end
  add_lease(id, S.now + waiter_lease)
  put('seq', S.seq + 1)
  put('qlen', S.qlen + 1)
  put('r:' .. id, record)
  label_add(label, 1)
  if t then
    -- (Behind others of its tenant: its turn is as it was.)
    tenant_add(tenant, 0, 1, position > 0)
  end
  -- Queued behind others (their tickets are lower): not the head.
  return { 'QUEUED', position, recheck_ms(id, waiter_lease, position > 0, t and position or nil) }
end

-- The place of the waiter `id` (its record `r`) in its queue (a named tenant's: in its
-- tenant's range of tqueue); nil if it has none.
local function waiter_rank(id, r)
  if r.tn then
    local member = tq_member(r.tn, r.tk, id)
    if not call(TQUEUE, 'ZSCORE', TQUEUE, member) then
      return nil
    end
    return call(TQUEUE, 'ZLEXCOUNT', TQUEUE, '[' .. r.tn .. '\0', '(' .. member)
  end
  return redis.call('ZRANK', QUEUE, id)
end
