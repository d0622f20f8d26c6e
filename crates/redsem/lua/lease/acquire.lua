-- lease_acquire: grant K units to a new request now, or (mode "wait") queue it. A request id
-- seen before (the same request, resent after a lost reply) is answered as by lease_poll.
-- KEYS: see lease/layout.lua
-- ARGV[1] request id   ARGV[2] capacity   ARGV[3] units k   ARGV[4] lease ms
-- ARGV[5] label ("" for none)   ARGV[6] "1" = one live request per label
-- ARGV[7] mode "try" | "wait"   ARGV[8] waiter lease ms   ARGV[9] wake channel
-- ARGV[10] this call's sequence number in the client's session   ARGV[11] the session id
-- ARGV[12] the session's low mark (see common.lua)
-- ARGV[13] tenant ("" or absent: the default tenant)   ARGV[14] the tenant's weight ("": 1)
-- ARGV[15] the tenant's cap ("": none)   (see lease/tenants.lua)
-- Returns: {"GRANTED", token, slot, slot, ...}
--        | {"QUEUED", position, recheck ms}          (mode "wait" only)
--        | {"BUSY", units in use, waiters}           (mode "try": no room, or others wait)
--        | {"GONE"}                                  (a late copy of a call withdrawn or answered)
--        | {"CONFLICT", capacity in force}           (a different capacity while in use)
--        | {"TENANT", tenant, weight, cap or -1}     (a different weight or cap in force)
--        | {"LABEL", label}                          (the label already holds or awaits one)
--        | {"TOOBIG", capacity}                      (k larger than the capacity in force,
--                                                     or than the tenant's cap)
--        | {"TOOMANY", most units per request}
--        | {"WRONGTYPE", key, actual, expected}
local request = {
  id = ARGV[1], cap = ARGV[2], k = ARGV[3], lease = ARGV[4], label = ARGV[5], exclusive = ARGV[6],
  mode = ARGV[7], waiter_lease = ARGV[8], channel = ARGV[9], seq = ARGV[10],
  tenant = ARGV[13] or '', weight = ARGV[14] or '', tcap = ARGV[15] or '',
}
open_session(ARGV[11], ARGV[12])
-- The uncontended grant of one unit takes fast_acquire (lease/fast.lua); every other request
-- goes by acquire() (lease/requests.lua, which lease_batch runs too), on the state read with
-- the request's record and the session's, and settled.
return run(function()
  return acquire(request)
end, 'r:' .. request.id, nil, fast_acquire, request)
