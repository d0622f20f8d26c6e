-- permit_add: add DELTA permits (a release, or add_permits; DELTA may be negative, and the
-- count may go below zero), then hand what is available to the head of the queue.
-- Applied once per request id: a call repeated with the same id changes nothing.
-- KEYS: see permit_prelude.lua
-- ARGV[1] request id   ARGV[2] delta (integer)
-- Returns: {"ADDED", available}
--        | {"REPEATED", available}   (this id was applied already)
--        | {"RANGE", available}      (the count would leave +-(2^53 - 1); nothing changed)
--        | {"WRONGTYPE", key, actual, expected}
-- (With nobody waiting, fast_add, in permit_prelude.lua.)
return run(function()
  return add_op(ARGV[1], ARGV[2])
end, nil, 'lazy', fast_add, ARGV)
