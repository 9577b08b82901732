-- Connection leases: the clock. ARGV[1] is an explicit time in µs (tests)
-- or empty for Redis's own TIME; integer arithmetic only (µs < 2^53).
local function int(x)
  -- Numbers go to Redis as "%d" strings (tostring would print 1.7e+15).
  return string.format('%d', x)
end
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
