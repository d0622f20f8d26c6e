-- common: joined in front of every prelude (lease, permit, latch) at compile time.

-- A command on one of our keys. If it fails (a foreign value there), the script body stops
-- before anything depending on that key is written; caught() turns that into a reply.
local function call(key, ...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    error({ key = key, cause = r })
  end
  return r
end

-- The reply for what pcall caught around a script body, and whether it is a WRONGTYPE.
-- `result.key` names one of our keys: WRONGTYPE unless the failed command's key holds the
-- type `expected[key]` (then its own error is passed on); a body that raised the error itself
-- (no cause) may name the type it wanted in `result.expected`. An expected 'integer' is a
-- string holding a number, so any failure there is a WRONGTYPE. Other errors pass on as they are.
local function caught(result, expected)
  if type(result) ~= 'table' then
    return redis.error_reply(tostring(result)), false
  end
  if not result.key then
    return result, false -- an error reply of a plain redis.call
  end
  local key = result.key
  local actual = redis.call('TYPE', key)['ok']
  local want = result.expected or expected[key]
  if result.cause and actual == want then
    return result.cause, false
  end
  return { 'WRONGTYPE', key, actual, want }, true
end

---------------------------------------------------------------------------------------
