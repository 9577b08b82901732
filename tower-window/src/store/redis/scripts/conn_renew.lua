-- Renews a node's leases of one hash slot in one call.
-- KEYS[i]  a lease set; ARGV[4 + i] the lease id in it
-- ARGV[1]  now (µs) or '' (Redis TIME)
-- ARGV[2]  lease TTL (µs)
-- ARGV[3]  key TTL (ms)
-- Reply: per key, 1 if the lease was live (and now runs until now + TTL),
-- 0 if it was expired or gone (an expired one is removed: never revived).
local ttl = tonumber(ARGV[2])
local key_ttl = tonumber(ARGV[3])
local out = {}
for i, key in ipairs(KEYS) do
  local id = ARGV[3 + i]
  local expiry = redis.call('ZSCORE', key, id)
  if expiry and tonumber(expiry) > now then
    redis.call('ZADD', key, 'XX', int(now + ttl), id)
    redis.call('PEXPIRE', key, int(key_ttl))
    out[i] = 1
  else
    if expiry then
      redis.call('ZREM', key, id)
    end
    out[i] = 0
  end
end
return out
