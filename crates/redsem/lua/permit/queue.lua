-- permit/queue: the head of the queue promoted, and a waiter's lease started or renewed.

-- Hand permits, in arrival order, to every waiter at the head of the queue that now fits,
-- and wake exactly those (one message each on their client's channel, sent once the state
-- is saved). Stops at the first waiter that does not fit, so a large request is never
-- overtaken by smaller ones behind it, and after MAX_STEPS heads: then the next head that
-- fits is woken without a grant, and its poll admits the next ones. Entries without a
-- record (lost) are dropped. A granted waiter keeps its waiter lease until it collects.
local function promote()
  while S.qlen > 0 do
    local head = call(QUEUE, 'ZRANGE', QUEUE, '0', '0')[1]
    if not head then
      put('qlen', 0)
      return
    end
    local name = 'r:' .. head
    local st, k, channel, digits = parse(field(name))
    if st == 'w' and k > (S.count or 0) then
      return
    end
    if S.steps >= MAX_STEPS then
      if st == 'w' then
        wake(channel, head)
      end
      return
    end
    S.steps = S.steps + 1
    redis.call('ZREM', QUEUE, head)
    put('qlen', S.qlen - 1)
    if st == 'w' then
      add(-k)
      put(name, 'g|' .. digits)
      wake(channel, head)
    end
  end
end

-- Start or renew the waiter lease of `id`, `lease` ms from now (not ZADD XX: an entry that
-- vanished is put back), counted in records at once; the QUEUED reply at `position`.
local function queued(id, lease, position)
  local deadline = S.now + lease
  local added = call(WAITERS, 'ZADD', WAITERS, deadline, id)
  if S.wlen == 0 then
    S.fresh_waiters = true
  end
  if S.wlen == 0 or not S.wnext or deadline < S.wnext then
    put('wnext', deadline)
  end
  if added == 1 then
    put('wlen', S.wlen + 1)
  end
  S.need = math.max(S.need, deadline)
  return { 'QUEUED', position, math.max(math.floor(lease / 3), 1) }
end
