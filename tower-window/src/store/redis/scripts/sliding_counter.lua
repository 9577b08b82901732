-- Sliding counter. KEYS[1] = HASH {bucket index floor(ts / G) -> units admitted}.
-- ARGV[4] = W (µs), ARGV[5] = L, ARGV[6] = G (bucket width, µs; divides W).
local key = KEYS[1]
local W = tonumber(ARGV[4])
local L = tonumber(ARGV[5])
local G = tonumber(ARGV[6])
local n = idiv(W, G)
local b = idiv(t, G)
local lowest = b - n

-- Buckets j in [b - n, b] count; older ones are dropped.
local buckets = {}
local stale = {}
local used = 0
local raw = redis.call('HGETALL', key)
for i = 1, #raw, 2 do
  local j = tonumber(raw[i])
  if j < lowest then
    stale[#stale + 1] = raw[i]
  else
    local count = tonumber(raw[i + 1])
    buckets[#buckets + 1] = {j, count}
    used = used + count
  end
end
if #stale > 0 then
  redis.call('HDEL', key, unpack(stale))
end

if c <= L and used + c <= L then
  redis.call('HINCRBY', key, int(b), int(c))
  -- reset_after (and TTL) from the newest bucket: b unless the clock stepped back.
  local newest = b
  for _, bucket in ipairs(buckets) do
    if bucket[1] > newest then
      newest = bucket[1]
    end
  end
  local reset_after = (newest + n + 1) * G - t
  expire(key, reset_after)
  return {1, L - used - c, reset_after, 0, t}
end

-- Denied: record nothing.
local remaining = L - used
table.sort(buckets, function(x, y) return x[1] < y[1] end)
local reset_after = 0
if #buckets > 0 then
  reset_after = (buckets[#buckets][1] + n + 1) * G - t
end
if c > L then
  return {0, remaining, reset_after, -1, t}
end
-- Bucket j stops counting at (j + n + 1) * G.
local freed = 0
for _, bucket in ipairs(buckets) do
  freed = freed + bucket[2]
  if used - freed + c <= L then
    return {0, remaining, reset_after, (bucket[1] + n + 1) * G - t, t}
  end
end
return {0, remaining, reset_after, reset_after, t}
