-- Fixed window. KEYS[1] = HASH {k = window index floor(ts / W), n = units admitted in it}.
-- ARGV[4] = W (µs), ARGV[5] = L.
local key = KEYS[1]
local W = tonumber(ARGV[4])
local L = tonumber(ARGV[5])
local k = idiv(t, W)

local state = redis.call('HMGET', key, 'k', 'n')
local count = 0
if state[1] and tonumber(state[1]) == k then
  count = tonumber(state[2]) or 0
end
local reset_after = (k + 1) * W - t

if c <= L and count + c <= L then
  count = count + c
  redis.call('HSET', key, 'k', int(k), 'n', int(count))
  expire(key, reset_after)
  return {1, L - count, reset_after, 0, t}
end

-- Denied: record nothing.
if c > L then
  return {0, L - count, reset_after, -1, t}
end
return {0, L - count, reset_after, reset_after, t}
