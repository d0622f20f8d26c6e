-- lease/layout: the lease semaphore's keys, records and rules, the first of the lease
-- prelude's files (script/library.rs joins them, after common.lua and in front of every lease
-- operation, so every operation sees the same KEYS layout and helpers).
--
-- KEYS (one hash tag, so one cluster slot):
--   1 leases  ZSET    id -> ms of Redis time: the lease end of every holder and waiter
--                     (positive), and s:<session> -> minus the expiry of that client
--                     session's record (negative, so sessions never look due as leases)
--   2 queue   ZSET    waiter id -> ticket (arrival order)
--   3 state   HASH    cap, used (units held), nh (holders), qlen (waiters), nt (session
--                     records), seq (ticket counter), tok (last fencing token), idle (ms
--                     when the idle keys expire; 0 while they carry no TTL), next (no lease
--                     ends before it; 0 = unknown), tnext (the first session record's expiry;
--                     0 = none), label:<label> (holders + waiters with that label), and
--                     r:<id> records:
--                       holder    "h|token|units|granted at|lease|slots|label", slots as
--                                 runs "first-last,slot,..."
--                       waiter    "w|units|since|lease|waiter lease|len(channel)|channel label"
--                     s:<session> client sessions (see common.lua): a holder's release marks
--                     its sequence number with its outcome (R released, D withdrawn), so its
--                     resend answers as it did while any other release of the id, afterwards,
--                     answers NOTHELD; a withdrawal of a request whose enqueue went unanswered
--                     marks that enqueue's number X, so a late copy of it is refused (GONE)
--   4 slots   STRING  bitmap: bit n set = slot n held; deleted when the idle TTL is set
--   5 tenants ZSET    the turns (lease/tenants.lua): each tenant that waits and whose head
--                     fits its cap, scored held units / weight, as "<head ticket, 16 hex
--                     digits><tenant>" (ties: the earliest head); empty unless tenants are used
--   6 tqueue  ZSET    the waiters of named tenants, all scored 0, as "<tenant>\0<ticket, 16
--                     hex digits><id>": each tenant's FIFO is one lex range (ZRANGEBYLEX)
-- With tenants (layout 3, while any named tenant holds or waits) the state also holds
-- t:<tenant> = "held|waiting|weight|cap|turn" (cap "" for none, turn the head ticket under
-- which it is listed in tenants, "" if it is not), one for the default tenant "" (t:), and tn
-- (named tenant records); a named tenant's records are "T<len>|<tenant>" and then a holder's
-- record, or the waiter's ticket (16 hex digits) and a waiter's record. The default
-- tenant's waiters stay in queue. Nothing of it exists while no named tenant is live.
--
-- Failure rules every script keeps:
--   * Nothing live carries a TTL: while anyone holds or waits, no key has one, so no
--     `volatile-*` eviction can pick it. Only an idle semaphore's keys expire (KEEP_IDLE_MS).
--     A release that leaves the semaphore idle does not set the TTL itself (the next acquire
--     would remove it again: two commands each way on the hot path); it answers IDLE and the
--     client sends lease_tidy a moment later, which sets it if the semaphore is still idle.
--   * Every key is first touched by a read, or by a write that fails before changing it (a
--     foreign type, a missing ACL right), and the body writes nothing but through call();
--     run() saves what was settled before such a failure (see common.lua).
--   * The work of one script is bounded by MAX_UNITS, WORK_BUDGET and SETTLE_BATCH, never
--     by the numbers it is given.
--   * The counters (used, nh, qlen, nt), labels and the slot bitmap are rebuilt from the
--     records (repair()) when a cheap check finds them disagreeing.
--   * Fencing tokens are max(last token + 1, TIME in microseconds): they keep increasing
--     after the state is lost (restart without persistence, flush, failover, expiry) as long
--     as the server clock does not go back by more than the outage.
local LEASES, QUEUE, STATE, SLOTS, TENANTS, TQUEUE

-- How long the keys of an idle semaphore are kept.
local KEEP_IDLE_MS = 3600000
-- Move the idle deadline only when it comes closer than this.
local KEEP_MARGIN_MS = 60000
-- The most units one request may take (the client checks this too).
local MAX_UNITS = 4096
-- Units one script may grant to or take from others (promote, settle), beyond its own
-- request: what is left over is done by the next script on this semaphore.
local WORK_BUDGET = 4096
-- Expired entries dropped by one script at most.
local SETTLE_BATCH = 256
-- Expired session records are dropped in batches, once the first is this late, at most this
-- many.
local PRUNE_LAG_MS = 2000
local PRUNE_BATCH = 4000
-- "No lease ends before": nothing is known to end (a double, exact).
local NEVER = 4503599627370496
-- The layout of the keys and records above, stored in the state hash (field `layout`) when
-- a state is made. A state that names another layout was written by a version of redsem
-- that keeps its state differently: every operation refuses it ({"LAYOUT", found, ours})
-- and changes nothing. A state without the field is of layout 1 (written before the field
-- existed, with a minute of tombstones in place of client sessions): load() adopts it when
-- idle (nobody holds or waits: its tombstones dropped, the capacity and last token kept) and
-- refuses it when live, as any other layout. Raise LAYOUT with any change an older version
-- would misread; the upgrade is "drain, then upgrade" (README).
local LAYOUT = '2'
-- The layout of a state while named tenants hold or wait (lease/tenants.lua): their records
-- and the turns would be misread by a version that knows only layout 2, which refuses it.
-- Written when the first named tenant comes and back to LAYOUT when the last one goes, so
-- a semaphore used without tenants stays readable by the versions before them.
local LAYOUT_TENANTS = '3'
-- Tenants: the largest weight, the longest name (bytes; no NUL).
local MAX_WEIGHT = 1000000
local MAX_TENANT = 256
-- A field longer than a listpack may hold (hash-max-listpack-value, 64 bytes by default):
-- written in every state hash, it makes Redis keep that hash as a hash table. A small hash is
-- otherwise one list (a listpack, up to 128 or 512 fields), which every field read scans from
-- its start and every write rewrites: with the records of a few dozen holders and waiters
-- and a minute of remembered ids in it, those scans were the largest single cost of every call
-- (docs/BENCHMARKS.md, "Where the server time goes").
local WIDE = '--------------------------------------------------------------------------------'

-- Per call (see begin()), beside common's S: S.mine, the caller's wake channel, and
-- S.handed, the grants made to waiters on it (returned instead of published; nil if none); S.defer_idle:
-- leave the idle TTL to lease_tidy; the units left for others (WORK_BUDGET).
local budget

-- Counts by their text, kept once converted: a look-up instead of a conversion (strtod costs
-- more than most commands). Only short texts (below 10^7: counters, capacities, slots, lease
-- times), which come back call after call; time stamps and tokens never repeat. Bounded: the
-- memo starts over when full. (A function library keeps it across calls, a script per call.)
local COUNTS, COUNTS_KEPT = {}, 0

local function count(value)
  local n = COUNTS[value]
  if n then
    return n
  end
  n = tonumber(value) -- (nil for false: an absent field)
  if n and n >= 0 and n == floor(n) then
    if n ~= value and #value < 8 then -- (a text, not a number)
      if COUNTS_KEPT == 4096 then
        COUNTS, COUNTS_KEPT = {}, 0
      end
      COUNTS[value], COUNTS_KEPT = n, COUNTS_KEPT + 1
    end
    return n
  elseif value == false or value == nil then
    return 0
  end
  error({ key = STATE, expected = 'hash of a semaphore (a count field is not a count)' })
end

-- tonumber(), from the memo when the text was read as a count before (a capacity, a lease
-- time given again and again).
local function number(value)
  return COUNTS[value] or tonumber(value)
end

-- Ascending slots as runs: {0, 1, 2, 7} -> "0-2,7".
local function runs(slots)
  local out, first = {}, 1
  for i = 1, #slots do
    if slots[i + 1] ~= slots[i] + 1 then
      out[#out + 1] = first == i and string.format('%d', slots[i])
        or string.format('%d-%d', slots[first], slots[i])
      first = i + 1
    end
  end
  return table.concat(out, ',')
end

-- Now in ms as text, formatted once per call (every record a call writes carries it).
local function now_text()
  local t = S.now_text
  if not t then
    t = format('%d', S.now)
    S.now_text = t
  end
  return t
end

-- A record is joined from texts (the counts from text()'s memo), not formatted: a format of
-- seven values cost more than the command that stores it. `token` is the token's text.
local function holder_record(token, k, lease, slots, label, tenant)
  local s = #slots == 1 and text(slots[1]) or runs(slots)
  local held = 'h|' .. token .. '|' .. text(k) .. '|' .. now_text() .. '|' .. text(lease) .. '|' .. s .. '|'
    .. label
  if tenant and tenant ~= '' then
    return 'T' .. text(#tenant) .. '|' .. tenant .. held
  end
  return held
end

local function waiter_record(k, lease, waiter_lease, channel, label)
  return 'w|' .. text(k) .. '|' .. now_text() .. '|' .. text(lease) .. '|' .. text(waiter_lease) .. '|'
    .. text(#channel) .. '|' .. channel .. label
end

-- A raw record as a table: holder {h = true, t, k, a, lease, s, l}, waiter {k, w, lease,
-- wl, c, l}; nil if none or unreadable. The token t and the times a
-- and w stay text (converted only where used: a release needs none of them); the counts
-- come from the memo (count()).
-- A named tenant's record adds tn (the tenant) and, a waiter's, tk (its ticket, 16 hex digits).
local H, W, T = 104, 119, 84 -- the bytes of 'h', 'w', 'T'
local function parse(raw)
  if not raw then
    return nil
  end
  local kind = byte(raw, 1)
  if kind == T then
    local len, at = match(raw, '^T(%d+)|()')
    if not len then
      return nil
    end
    local stop = at + tonumber(len)
    local tenant, ticket = string.sub(raw, at, stop - 1), nil
    if byte(raw, stop) ~= H then
      ticket, stop = string.sub(raw, stop, stop + 15), stop + 16
    end
    local r = byte(raw, stop) ~= T and parse(string.sub(raw, stop))
    if r and (ticket ~= nil) == not r.h and tenant ~= '' then
      r.tn, r.tk = tenant, ticket
      return r
    end
    return nil
  elseif kind == H then
    local t, k, a, lease, slots, label = match(raw, '^h|(%d+)|(%d+)|(%d+)|(%d+)|([%d,%-]*)|(.*)$')
    if not t then
      return nil
    end
    local one = COUNTS[slots] or tonumber(slots) -- a single slot (the usual case): no runs to split
    if one then
      return { h = true, t = t, k = count(k), a = a, lease = count(lease), s = { one }, l = label }
    end
    local s = {}
    for run in string.gmatch(slots, '[%d%-]+') do
      local first, last = string.match(run, '^(%d+)%-(%d+)$')
      first, last = tonumber(first or run), tonumber(last or run)
      for n = first or 0, last or -1 do
        s[#s + 1] = n
      end
    end
    return { h = true, t = t, k = count(k), a = a, lease = count(lease), s = s, l = label }
  elseif kind == W then
    local k, since, lease, wl, clen, rest = match(raw, '^w|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
    if not k then
      return nil
    end
    clen = count(clen)
    return {
      k = count(k), w = since, lease = count(lease), wl = count(wl),
      c = string.sub(rest, 1, clen), l = string.sub(rest, clen + 1),
    }
  end
  return nil
end

local function record(id)
  return parse(field('r:' .. id))
end
