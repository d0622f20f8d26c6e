-- permit/count: the count read, and changed in memory (written back at the save).

-- Read the count (nil if absent).
local function read_count()
  S.count, S.unread = read_integer(COUNT), false
  return S.count
end

-- Change the count by `delta` (the count is created if absent, as INCRBY would).
local function add(delta)
  S.create_count = S.create_count or not S.count
  S.count = (S.count or 0) + delta
  S.taken = S.taken - delta
end
