-- permit/settle: what every call does after load: expired session records pruned, expired
-- waiters dropped, the queue promoted; and begin(), which hands load, settle and keep to
-- common's run().

-- Drop expired session records, drop waiters whose lease ended (giving back what was
-- granted to them and never collected), and hand what is available to the queue.
local function settle()
  local now = S.now
  if S.prune and now >= S.prune then
    local due = call(APPLIED, 'ZRANGEBYSCORE', APPLIED, '-inf', now, 'LIMIT', 0, PRUNE_BATCH)
    if #due > 0 then
      redis.call('ZREMRANGEBYRANK', APPLIED, 0, #due - 1)
      for _, session in ipairs(due) do
        put(session, false)
      end
    end
    if #due == PRUNE_BATCH then
      put('prune', now)
    else
      local first = redis.call('ZRANGE', APPLIED, 0, 0, 'WITHSCORES')[2]
      put('prune', first and tonumber(first) + PRUNE_EVERY_MS or false)
    end
  end

  if S.wlen > 0 and now >= (S.wnext or 0) then
    local ids = call(WAITERS, 'ZRANGEBYSCORE', WAITERS, '-inf', now, 'LIMIT', 0, EXPIRE_BATCH)
    if #ids > 0 then
      redis.call('ZREMRANGEBYRANK', WAITERS, 0, #ids - 1)
      local names, queued = {}, {}
      for i, id in ipairs(ids) do
        names[i] = 'r:' .. id
      end
      local raws = redis.call('HMGET', RECORDS, unpack(names))
      for i, id in ipairs(ids) do
        local st, k = parse(raws[i])
        if st == 'w' then
          queued[#queued + 1] = id
        elseif st == 'g' then
          add(k)
        end
        put(names[i], false)
      end
      if #queued > 0 then
        put('qlen', math.max(S.qlen - call(QUEUE, 'ZREM', QUEUE, unpack(queued)), 0))
      end
      put('wlen', math.max(S.wlen - #ids, 0))
    end
    local first = S.wlen > 0 and redis.call('ZRANGE', WAITERS, 0, 0, 'WITHSCORES')[2]
    if #ids == EXPIRE_BATCH then
      first = now -- more are due
    end
    put('wnext', first and tonumber(first) or false)
    if not first then
      put('wlen', 0)
    end
  end
  promote()
end

-- Start a call: its keys, a fresh per-call state and the hooks run() calls.
local HOOKS = { load = load, settle = settle, save = keep }
local function expected()
  return {
    [COUNT] = 'integer', [QUEUE] = 'zset', [WAITERS] = 'zset', [RECORDS] = 'hash', [META] = 'hash', [APPLIED] = 'zset',
  }
end
local function begin(keys)
  COUNT, QUEUE, WAITERS, RECORDS, META, APPLIED = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6]
  start(RECORDS, expected, HOOKS)
  S.taken, S.need, S.steps = 0, 0, 0
end
