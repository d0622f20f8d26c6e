-- permit/layout: the permit semaphore's keys, records and rules, the first of the permit
-- prelude's files (script/library.rs joins them, after common.lua and in front of every permit
-- operation, so every operation sees the same KEYS layout and helpers).
--
-- KEYS (one hash tag, so one cluster slot):
--   1 count    STRING available permits, may be negative, within +-(2^53 - 1); absent until
--                     first set or added. Never expires.
--   2 queue    ZSET   waiting request id -> ticket (arrival order)
--   3 waiters  ZSET   request id -> waiter-lease end, ms of Redis time: requests waiting, and
--                     requests granted while they waited that have not collected the grant
--   4 records  HASH   r:<id> a request: "w|k|since|channel" waiting, "g|k" granted (not
--                     collected) (k permits); s:<session> client session records (see
--                     common.lua) marking the calls in flight whose answers a resend must find:
--                     "G<k>" k permits taken (granted at once, or collected), "A" an addition
--                     applied, "D<n>" a drain that took n, "S" a count set, "X" a request
--                     withdrawn; and the fields read with them: layout ("2"), keep (ms until
--                     which every key but the count is kept once idle), live ("1" while anyone
--                     waits or a grant is uncollected), prune (when to drop expired session
--                     records next), wlen (size of waiters), wnext (no waiter lease ends before
--                     it), qlen (size of queue)
--   5 meta     HASH   seq (ticket counter)
--   6 sessions ZSET   s:<session> -> the expiry of that session's record, ms of Redis time
--
-- Layout 2 (client sessions; layout 1 remembered every request id for a minute): an idle
-- state of layout 1 is taken over (its records and remembered ids dropped, the count kept),
-- a live one refused ({"LAYOUT", key, found, ours}).
--
-- Expiry (keep-alive, see common.lua): while anyone waits (live), no key carries a TTL. Once
-- idle, keys 2-6 (session records, the ticket counter) expire KEEP_IDLE_MS after the latest
-- session expiry or deadline; the count never does.
--
-- Failures: a script validates before its first write (a foreign value is found at the first
-- access of its key; run() then saves what was settled before and answers WRONGTYPE).
--
-- Work per call is bounded whatever the numbers given: at most MAX_STEPS queue heads are
-- granted or dropped per call (the next one in line is then woken, and its own poll admits
-- the next ones), at most EXPIRE_BATCH expired waiters dropped and PRUNE_BATCH session records.
--
-- Lost state: if records vanish while the queue or waiters remain, qlen and wlen are rebuilt
-- from them (entries without a record are dropped); a waiter whose record or queue entry
-- vanished is told GONE and queues again. Nothing is granted that the count does not hold.
--
-- Cost: a call reads the fields of records once (HMGET), changes them in Lua (put), and
-- writes them back together, and the count with one INCRBY, at the end. The bookkeeping
-- keys' lives are extended about twice a minute while idle, not on every call.
local COUNT, QUEUE, WAITERS, RECORDS, META, APPLIED

-- Dropping expired session records is batched: one goes up to this much after its expiry.
local PRUNE_EVERY_MS = 10000
-- Session records dropped, and expired waiters dropped, per call at most.
local PRUNE_BATCH = 256
local EXPIRE_BATCH = 1000
-- Queue heads granted (or dropped) per call at most; the rest are admitted by later calls.
local MAX_STEPS = 100
-- Idle bookkeeping is kept this long after the latest session expiry or deadline; the deadline
-- moves when one comes within KEEP_MARGIN_MS of it.
local KEEP_IDLE_MS = 60000
local KEEP_MARGIN_MS = 30000
-- A field longer than a listpack may hold (hash-max-listpack-value, 64 bytes by default),
-- written in the records hash with its first write: Redis then keeps the hash as a hash
-- table, whose fields cost the same to read and write however many records it holds (a
-- listpack is scanned from its start on every access; see the lease prelude's WIDE).
local WIDE = '--------------------------------------------------------------------------------'
-- The layout of these keys and records, stored in records (field `layout`); see the top.
local LAYOUT = '2'

-- Per call, beside common's S: the count (nil if absent; unread: not read yet), the permits
-- taken by this call (taken, written back as one INCRBY; create_count: INCRBY even if 0),
-- the latest deadline this call set (need: keep must cover it), the keys it created
-- (fresh_*: they get keep), and the queue heads promote() handled (steps).

-- A record's state, permits (a number, and as written) and wake channel.
local function parse(raw)
  if not raw then
    return nil, 0
  end
  local st, k, channel = string.match(raw, '^(%a)|?(%d*)|?%d*|?(.*)$')
  return st, tonumber(k) or 0, channel, k
end
