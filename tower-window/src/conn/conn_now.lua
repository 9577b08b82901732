-- Connection seats: the clock. ARGV[1] is an explicit time in µs (tests)
-- or empty for Redis's own TIME; integer arithmetic only (µs < 2^53).
-- Arguments the caller always sends as numbers are read with `+ 0`: one
-- conversion, where tonumber converts twice.
local function int(x)
  -- Numbers go to Redis as "%d" strings (tostring would print 1.7e+15).
  return string.format('%d', x)
end
local now
if ARGV[1] ~= '' then
  now = ARGV[1] + 0
else
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
-- Gives `key` a TTL of at least `ms`, never a shorter one than it has:
-- nodes with different seat TTLs (a rolling change) write the same keys,
-- and a key must outlive the longest seat in it, not the last writer's.
-- PTTL is -1 for a key without a TTL (gets one) and -2 for none (no-op).
local function extend(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, int(ms))
  end
end
