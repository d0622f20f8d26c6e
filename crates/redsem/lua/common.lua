-- common: the runtime every operation runs on, joined in front of the preludes (lease,
-- permit, latch). A prelude names its keys and record formats and hands start() its hooks;
-- an operation file is one body given to run():
--
--   return run(function() ... return reply end, field, mode)
--
-- run() starts the call (begin() has named its keys), then around the body:
--   fast    run(body, field, mode, fast, arg): fast(arg, field) first, if given; a reply
--           from it is the call's (nothing below runs but save, which finds nothing to
--           write), nil goes on (the lease's uncontended paths, lease/fast.lua).
--   load    hooks.load(field, mode) reads the primitive's state (and the hash field `field`,
--           usually the caller's record) with the time; it answers whether there is state
--           to settle. mode "bare": nothing is loaded (nor saved).
--   settle  hooks.settle() drops what has expired and promotes waiters; skipped when load
--           found nothing to settle, and with mode "unsettled".
--   body    the operation itself, on the cached fields (field(), put()).
--   save    hooks.save() (the primitive's counters and keep-alive), then the changed fields
--           are written back in slices, the TTLs set by expire_at() given, and the wake-ups
--           published, last, with pcall: a refused PUBLISH (an ACL without channel rights)
--           costs a waiter one timer re-check, never a half-saved state.
-- If one of our keys fails its first access (a foreign value, a missing right), the reply
-- says so (caught()), and what was settled before is saved.
--
-- Keep-alive: while anyone holds or waits, none of a primitive's keys carries a TTL, so no
-- volatile-* eviction policy can pick one (persist()). Once idle, its keys expire at a
-- deadline kept in its hash, moved only when it comes within a margin of where it should
-- be, so idle calls seldom touch TTLs (expire_at()). Each prelude names its idle time and
-- margin (KEEP_IDLE_MS, KEEP_MARGIN_MS).
--
-- Cost: every redis.call costs about a microsecond, more than most commands themselves, so
-- a call reads its fields once, changes them in Lua and writes them back together. The hot
-- path also avoids what Lua makes slow: look-ups of the library functions it calls most
-- (bound to locals below), closures and tables made per call, and numbers as arguments of
-- redis.call (see digits()).
--
-- Names: an operation file names its arguments at its top (`local id, lease = ARGV[1],
-- ARGV[2]`, or a table `request` for what a fast path and a group commit share) and uses
-- the names; a primitive's hash is read by one reader function, beside which its fields are
-- named (stored[CAP] is the field cap as read: lease/state.lua, permit/state.lua), and load()
-- keeps them in S by the same names (S.cap).
--
-- Numbers: what Redis hands a script is text (ARGV, the fields of a hash, GET), and a
-- number stays text until arithmetic needs it. It is converted once, where it is named: an
-- operation's numeric arguments at the top of its body or of the request function it calls
-- (tonumber(), or the lease's number(), a memo of short texts), a state's counters by load()
-- (the lease's count(), tonumber() elsewhere), a session number (hexadecimal) by seqno().
-- Ids, labels, channels, tokens and the times in records stay text unless arithmetic needs
-- them (a token to make the next one, a time to compute an age). A number goes back to Redis
-- as text on the hot paths: text() for a field written back (save()), digits() for a
-- command's argument, format('%x') for a session number. Elsewhere (a time bound, a ticket, a
-- rank) it may go as the number itself: Redis prints an integer the same, only dearer.

-- The library functions the hot path calls most, as locals: reading a local costs a
-- fraction of a global and a field look-up. A function library may not read them while it
-- loads, so start() binds them at the first call (builtins() is defined before the locals,
-- so its names are the globals). Only these few: every local the helpers capture makes a
-- script (EVALSHA, which builds the helpers on every call) a little dearer.
local function builtins()
  return string.format, string.match, string.byte,
    math.floor, math.max, math.min, redis.call, redis.pcall
end
local format, match, byte, floor, max, min, rcall, rpcall

-- Redis scripts count in doubles: integers are exact within +-MAX_INT.
local MAX_INT = 9007199254740991
-- Field/value pairs per HSET, and half the names per HDEL (unpack() fails near 8000 values).
local SLICE = 500

-- A command on one of our keys. If it fails (a foreign value there), the script body stops
-- before anything depending on that key is written; caught() turns that into a reply.
local function call(key, ...)
  local r = rpcall(...)
  if type(r) == 'table' and r.err then
    error({ key = key, cause = r })
  end
  return r
end

-- The reply for what pcall caught around a script body. `expected()` gives the type each of
-- our keys should hold (built only here, on a failure).
-- `result.key` names one of our keys: WRONGTYPE unless the failed command's key holds the
-- type `expected()[key]` (then its own error is passed on); a body that raised the error itself
-- (no cause) may name the type it wanted in `result.expected`. An expected 'integer' is a
-- string holding a number, so any failure there is a WRONGTYPE. Other errors pass on as they are.
local function caught(result, expected)
  if type(result) ~= 'table' then
    return redis.error_reply(tostring(result))
  end
  if not result.key then
    return result -- an error reply of a plain redis.call
  end
  local key = result.key
  local actual = redis.call('TYPE', key)['ok']
  local want = result.expected or expected()[key]
  if result.cause and actual == want then
    return result.cause
  end
  return { 'WRONGTYPE', key, actual, want }
end

-- Per call (see start()): the primitive's hash of fields, the function that gives its keys'
-- expected types and its hooks; S: the fields read or changed (false: absent, or to delete)
-- and the call's own state (now, loaded, ...); dirty: the fields to write back; outbox:
-- wake-ups to publish after everything is saved (channel, message, ...); expiring: TTLs to
-- give after the write-back (key, deadline, ...). outbox and expiring are made when first
-- used (most calls have none).
local HASH, EXPECTED, HOOKS, S, dirty, outbox, expiring

-- Start a call. (Loaded as a function library, these helpers outlive a call: nothing of one
-- call may leak into the next.) `expected` is a function returning {key = type}, called only
-- when a command on one of the keys fails; `state`, if given, is the fresh S (a prelude may
-- size it for the fields it uses, sparing Lua the rehashes of a growing table).
local function start(hash, expected, hooks, state)
  if not rcall then
    format, match, byte, floor, max, min, rcall, rpcall = builtins()
  end
  HASH, EXPECTED, HOOKS = hash, expected, hooks
  S, dirty, outbox, expiring = state or {}, {}, nil, nil
end

-- Redis time, read once per call: S.now in ms, S.now_us in microseconds (exact in a double
-- until the year 2255).
local function clock()
  if not S.now then
    local t = rcall('TIME')
    local s, us = tonumber(t[1]), tonumber(t[2])
    S.now, S.now_us = s * 1000 + floor(us / 1000), s * 1000000 + us
  end
  return S.now
end

-- A field of the hash, read once per call (false if absent).
local function field(name)
  if S[name] == nil then
    S[name] = call(HASH, 'HGET', HASH, name)
  end
  return S[name]
end

-- Change a field (false deletes it); written back by save().
local function put(name, value)
  S[name] = value
  dirty[name] = true
end

-- The text of numbers from 0 to 10^6 (counts, slots, lease times), kept once formatted: a
-- function library formats each once, a script (EVALSHA, a fresh state per call) the few it
-- meets. Bounded: starts over when full.
local TEXT, TEXT_KEPT = {}, 0

-- Integers go out with %d: Lua would print 16 digits as 1.79e+15.
local function text(value)
  if type(value) == 'number' then
    local t = TEXT[value]
    if not t then
      t = format('%d', value)
      if value >= 0 and value < 1000000 then
        if TEXT_KEPT == 4096 then
          TEXT, TEXT_KEPT = {}, 0
        end
        TEXT[value], TEXT_KEPT = t, TEXT_KEPT + 1
      end
    end
    return t
  end
  return value
end

-- A number as an argument of redis.call. Redis prints a Lua number with %.17g, which costs
-- more than a short command itself (a 16-digit number about 0.4 us); an integer of up to 17
-- digits prints the same with %d in Lua, at a fraction of that. (-0 stays a number: Redis
-- prints it "-0".)
local function digits(value)
  if value == 0 then
    return 1 / value > 0 and '0' or value
  elseif TEXT[value] then
    return TEXT[value]
  elseif value % 1 == 0 and value > -1e17 and value < 1e17 then
    return format('%d', value)
  end
  return value
end

-- The integer stored at `key` (nil if absent), within +-MAX_INT; with `natural`, not below
-- 0. Any other value there is foreign, also one Redis itself would not count with (INCRBY,
-- DECR: a leading zero, "-0", a sign "+").
local function read_integer(key, natural)
  local raw = call(key, 'GET', key)
  if raw and raw ~= '0' and (not string.match(raw, natural and '^[1-9]%d*$' or '^%-?[1-9]%d*$')
    or math.abs(tonumber(raw)) > MAX_INT) then
    error({ key = key })
  end
  return tonumber(raw)
end

-- Client sessions. Each client (a `Redsem`) names its calls by a session id and a sequence
-- number, and sends with each call its low mark: every sequence number below it belongs to a
-- call the client has its answer to, or has given up. A primitive keeps one record per
-- session, "low|expiry|top|,seq=M,seq=M...": the highest low mark seen, when the record goes
-- (ms of Redis time), the highest number marked, and a mark for each call at or above the
-- low mark whose answer a resend must find (a letter, maybe with digits: a release's outcome,
-- a withdrawn request, permits taken). A call below the low mark is stale (its answer was
-- given) and is never applied; a mark goes once the low mark passes it. So a record holds
-- the calls a client has in flight, never its history: memory grows with clients, not with
-- throughput. A record is kept SESSION_MS after it was last renewed, far past the longest a
-- client resends (about a minute), and renewed when it was last renewed SESSION_RENEW_MS ago
-- or more. The caller's record is the field S.sess, read with the primitive's state; it is
-- parsed once per call (session()), and its marks only when a number could be marked.
--
-- Every number of a session, in the arguments and in the record, is hexadecimal text: Lua
-- reads a decimal one with strtod (about a microsecond of work per number, several numbers
-- per call), a hexadecimal one with strtoul (tonumber(text, 16)), at a fraction of that.
local SESSION_MS = 600000
local SESSION_RENEW_MS = 60000

-- A session number (hexadecimal text) as a number; 0 if absent or not one.
local function seqno(text)
  return text and tonumber(text, 16) or 0
end

-- Name the caller's session for this call: S.sess, the field of its record ("s:" and the
-- session id), and S.low, the low mark the call carries (hexadecimal text, as a number).
local function open_session(id, low)
  S.sess, S.low = 's:' .. (id or ''), seqno(low)
end

-- Parse the caller's session record S[S.sess] once per call: S.sl its low mark, S.sx its
-- expiry (text), S.sm the highest number marked, S.sp where its marks start (0 if none).
local function session()
  if S.sl == nil then
    local raw = S.sess and S[S.sess]
    local low, expiry, top, at
    if raw then
      low, expiry, top, at = match(raw, '^(%x+)|(%x+)|(%x+)|()')
    end
    S.sl, S.sx, S.sm, S.sp = low and tonumber(low, 16) or 0, expiry or '0', top and tonumber(top, 16) or 0, at or 0
  end
end

-- Whether the call numbered `seq` (text) is stale: below its session's low mark (a late copy
-- of a call whose answer the client has).
local function session_stale(seq)
  session()
  return (seq and tonumber(seq, 16) or 0) < S.sl
end

-- The mark of the call numbered `seq` (text) in its session's record, or nil.
local function session_mark(seq)
  session()
  local marks = S.smarks
  if marks then
    return marks[seq]
  elseif S.sp == 0 or seqno(seq) > S.sm then
    return nil
  end
  local raw = S[S.sess]
  local at = string.find(raw, ',' .. seq .. '=', S.sp, true)
  return at and match(raw, '^[^,]+', at + #seq + 2) or nil
end

-- Raise the caller's low mark to `low` (a number) and mark the call numbered `seq` (text)
-- `mark`. Answers the record's new text, or nil when other marks are kept with it (calls
-- in flight, or several marks in one call: a batch): then they are kept in a table,
-- S.smarks, and the record is written once, at the save (session_text()). And answers the
-- record's new expiry when it was renewed (a new record, or one renewed long enough ago),
-- else nil: the caller then registers the expiry where its primitive prunes records.
local function session_put(low, seq, mark)
  session()
  if S.sl > low then
    low = S.sl
  end
  local expiry, renewed = S.sx, nil
  if tonumber(expiry, 16) - SESSION_MS + SESSION_RENEW_MS <= clock() then
    renewed = S.now + SESSION_MS
    expiry = format('%x', renewed)
  end
  S.sl, S.sx = low, expiry
  local marks = S.smarks
  if not marks and S.sm < low then
    -- (The usual case: every earlier mark is passed, one is made.)
    local value = format('%x|', low) .. expiry .. '|' .. seq .. '|,' .. seq .. '=' .. mark
    S[S.sess], S.sm, S.sp = value, tonumber(seq, 16) or 0, #value - #seq - #mark - 1
    return value, renewed
  end
  if not marks then
    -- (S.sorder: the marked numbers in the order first met, the record's then the call's,
    -- so the record is written in an order of its own, not in the table's.)
    marks, S.sorder = {}, {}
    for s, m in string.gmatch(string.sub(S[S.sess], S.sp), ',(%x+)=([^,]+)') do
      if not marks[s] then
        S.sorder[#S.sorder + 1] = s
      end
      marks[s] = m
    end
    S.smarks = marks
  end
  if not marks[seq] then
    S.sorder[#S.sorder + 1] = seq
  end
  marks[seq] = mark
  return nil, renewed
end

-- The caller's record with the marks kept in S.smarks (those at or above its low mark), in
-- the order S.sorder keeps.
local function session_text()
  local kept, n, top, marks = {}, 0, 0, S.smarks
  for _, s in ipairs(S.sorder) do
    local number = seqno(s)
    if number >= S.sl then
      n = n + 1
      kept[n] = ',' .. s .. '=' .. marks[s]
      top = max(top, number)
    end
  end
  return format('%x|', S.sl) .. S.sx .. format('|%x|', top) .. table.concat(kept, '', 1, n)
end

-- Take the TTL off `keys` (the primitive is live).
local function persist(keys)
  for _, key in ipairs(keys) do
    redis.call('PERSIST', key)
  end
end

-- Make `keys` expire at `at` (ms of Redis time), once the fields are written back (the
-- write-back may create the hash).
local function expire_at(at, keys)
  expiring = expiring or {}
  for _, key in ipairs(keys) do
    expiring[#expiring + 1] = key
    expiring[#expiring + 1] = at
  end
end

-- Publish `message` on `channel` once everything is saved.
--
-- Sharded or classic: a channel whose last byte is '}' is published with SPUBLISH, any
-- other with PUBLISH. This is the one rule (docs/DESIGN.md, "Wake-up channels"; the native
-- engine and the client, keys::is_sharded, apply it the same). A client on a Redis Cluster
-- names its channels `<prefix>:wake:<client>:{<kind>:<name>}` and
-- `<prefix>:opened:{latch:<name>}`: they end with the primitive's hash tag, so they lie in
-- the slot of its keys, and SPUBLISH reaches the one node that owns it (and its replicas)
-- where the waiter subscribed with SSUBSCRIBE, not every node of the cluster. Classic
-- channels (one server, Sentinel) end with a client id or ':opened', never with '}'.
local function wake(channel, message)
  outbox = outbox or {}
  outbox[#outbox + 1] = channel
  outbox[#outbox + 1] = message
end

-- The last thing every call does: the primitive's own part (if it loaded), the changed
-- fields written back in slices, the TTLs, then the wake-ups.
local function save()
  if S.loaded then
    HOOKS.save()
  end
  if S.smarks then
    -- (The caller's session record, its marks kept in a table by session_put().)
    S[S.sess], dirty[S.sess] = session_text(), true
  end
  if not (next(dirty) or expiring or outbox) then
    return -- (a fast path, or a call that changed nothing)
  end
  -- (Sized for the usual write-back of up to six fields.)
  local args, n, gone = { nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil }, 0, nil
  for name in pairs(dirty) do
    local value = S[name]
    if value then
      args[n + 1] = name
      args[n + 2] = text(value)
      n = n + 2
    else
      gone = gone or {}
      gone[#gone + 1] = name
    end
  end
  for i = 1, n, 2 * SLICE do
    rcall('HSET', HASH, unpack(args, i, min(i + 2 * SLICE - 1, n)))
  end
  if gone then
    for i = 1, #gone, 2 * SLICE do
      rcall('HDEL', HASH, unpack(gone, i, min(i + 2 * SLICE - 1, #gone)))
    end
  end
  if expiring then
    for i = 1, #expiring, 2 do
      rcall('PEXPIREAT', expiring[i], expiring[i + 1])
    end
  end
  if outbox then
    for i = 1, #outbox, 2 do
      local channel = outbox[i]
      rpcall(byte(channel, -1) == 125 and 'SPUBLISH' or 'PUBLISH', channel, outbox[i + 1]) -- 125: '}'
    end
  end
end

-- Load, settle and the body, under run()'s pcall (a function of its own: no closure per call).
-- A fast path `fast(arg, name)`, if given, comes first: its reply, if any, is the call's.
local function settled(body, name, mode, fast, arg)
  if fast then
    local reply = fast(arg, name)
    if reply then
      return reply
    end
  end
  if mode ~= 'bare' and HOOKS.load and HOOKS.load(name, mode) and mode ~= 'unsettled' then
    HOOKS.settle()
  end
  return body()
end

-- Run an operation's body: load, settle, the body, save (see the top of this file).
local function run(body, name, mode, fast, arg)
  local ok, result = pcall(settled, body, name, mode, fast, arg)
  if ok then
    save()
    return result
  end
  local reply = caught(result, EXPECTED)
  if S.loaded and type(result) == 'table' and result.key then
    -- What was settled before the failure is kept; S.failed tells the save hook that the
    -- call itself did not happen (no keep-alive change on its account).
    S.failed = true
    save()
  end
  return reply
end

---------------------------------------------------------------------------------------
