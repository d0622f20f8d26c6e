-- lease/settle: what every call does after load: expired session records pruned, expired
-- holders and waiters dropped, the queue promoted; and begin(), which hands load, settle and
-- keep to common's run().

-- Drop session records past their expiry, in batches once the first is PRUNE_LAG_MS late.
-- (Their entries in leases are named as their fields: s:<session>.)
local function prune()
  if S.tnext == 0 or S.tnext + PRUNE_LAG_MS > S.now then
    return
  end
  local due = call(LEASES, 'ZRANGEBYSCORE', LEASES, -S.now, '(0', 'LIMIT', 0, PRUNE_BATCH)
  for _, name in ipairs(due) do
    S[name] = false
  end
  for i = 1, #due, SLICE do
    redis.call('HDEL', STATE, unpack(due, i, math.min(i + SLICE - 1, #due)))
    redis.call('ZREM', LEASES, unpack(due, i, math.min(i + SLICE - 1, #due)))
  end
  put('nt', math.max(S.nt - #due, 0))
  local first = #due < PRUNE_BATCH and redis.call('ZREVRANGEBYSCORE', LEASES, '(0', '-inf', 'LIMIT', 0, 1, 'WITHSCORES')[2]
  if #due == PRUNE_BATCH then
    put('tnext', S.now - PRUNE_LAG_MS) -- more are due
  else
    put('tnext', first and -tonumber(first) or 0)
  end
end

-- The settle's promote, for work an earlier script left (its budget spent, or a step it
-- could not finish). Not while every unit is held: then no waiter fits, and what promote()
-- would still do at the head (drop a waiter larger than a shrunk capacity, or an entry
-- without its waiter record) waits until units are free, when the next promote() reaches
-- it. (Every script that frees units promotes before it ends, so a contended call does not
-- read the queue head for nothing.)
local function promote_left()
  if S.used < S.cap then
    promote()
  end
end

-- Drop expired holders and waiters (at most SETTLE_BATCH, and holders only while the budget
-- lasts: the rest stay counted until a later script), then promote. Skipped while `next`
-- says no lease can have ended yet.
local function settle()
  prune()
  if S.next > S.now then
    promote_left()
    return
  end
  local due = call(LEASES, 'ZRANGEBYSCORE', LEASES, 0, S.now, 'LIMIT', 0, SETTLE_BATCH)
  if #due > 0 then
    local names = {}
    for i, id in ipairs(due) do
      names[i] = 'r:' .. id
    end
    local raws = redis.call('HMGET', STATE, unpack(names))
    local done = {}
    for i, id in ipairs(due) do
      local r = parse(raws[i])
      S[names[i]] = raws[i]
      if r and r.h then
        if budget < r.k and #done > 0 then
          break
        end
        budget = budget - r.k
        drop_holder(id, r)
      elseif r then
        drop_waiter(id, r)
      end
      done[#done + 1] = id
    end
    redis.call('ZREM', LEASES, unpack(done))
  end
  local first = redis.call('ZRANGEBYSCORE', LEASES, 0, '+inf', 'LIMIT', 0, 1, 'WITHSCORES')[2]
  put('next', first and tonumber(first) or NEVER)
  promote_left()
end

-- Start a call: its keys, a fresh per-call state and the hooks run() calls.
local HOOKS = { load = load, settle = settle, save = keep }
local function expected()
  return {
    [LEASES] = 'zset', [QUEUE] = 'zset', [STATE] = 'hash', [SLOTS] = 'string', [TENANTS] = 'zset', [TQUEUE] = 'zset',
  }
end
local function begin(keys)
  LEASES, QUEUE, STATE, SLOTS, TENANTS, TQUEUE = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6]
  -- S, sized for the fields every call sets (and the caller's record).
  start(STATE, expected, HOOKS, {
    now = nil, now_us = nil, loaded = nil, cap = nil, used = nil, qlen = nil, seq = nil, idle = nil,
    tok = nil, nh = nil, nt = nil, next = nil, tnext = nil, mine = nil, defer_idle = nil,
    read = nil, checked = nil, heads = nil, at = nil, window = nil, now_text = nil, tmode = nil, tt = nil,
  })
  budget = WORK_BUDGET
end
