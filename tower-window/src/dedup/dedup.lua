-- Dedup with an explicit clock (tests): the production path is a plain
-- `SET key 1 NX PX window`, expiring on Redis's own clock.
-- KEYS[1]  the id's key
-- ARGV[1]  now (µs, from the store's explicit clock)
-- ARGV[2]  window (µs)
-- ARGV[3]  TTL (ms): at least the window
-- Returns 1 when the id is first seen (and records it), 0 for a repeat.
local now = ARGV[1] + 0
local seen = redis.call('GET', KEYS[1])
if seen and tonumber(seen) > now then
  return 0
end
redis.call('SET', KEYS[1], string.format('%d', now + ARGV[2]), 'PX', ARGV[3])
return 1
