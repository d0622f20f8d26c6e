-- permit_poll: a queued request checks in. Renews its place in the queue, or, if permits
-- were handed to it while it waited, collects them.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id   ARGV[2] waiter lease ms
-- Returns: {"GRANTED"}                       (also when repeated after a collection)
--        | {"QUEUED", position, recheck ms}
--        | {"GONE"}        (neither queued nor granted: its waiter lease ended, it was withdrawn,
--                           or its record or place in the queue was lost; the caller queues
--                           again under a new request id)
--        | {"WRONGTYPE", key, actual, expected}
return run(function()
  return check_in(ARGV[1], tonumber(ARGV[2]))
end, 'r:' .. ARGV[1])
