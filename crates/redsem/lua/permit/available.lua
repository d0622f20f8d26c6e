-- permit_available: the permits available now and the requests waiting, after dropping
-- waiters whose lease ended.
-- KEYS: see permit/layout.lua
-- ARGV: none
-- Returns: {"AVAILABLE", available (0 if never set), waiting requests, 1 if set else 0}
--        | {"WRONGTYPE", key, actual, expected}
return run(function()
  return { 'AVAILABLE', S.count or 0, S.qlen, S.count and 1 or 0 }
end)
