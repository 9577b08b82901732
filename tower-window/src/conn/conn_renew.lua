-- Renews a node's seats of one hash slot in one call.
-- KEYS[i]  a seat set; ARGV[3 + i] the seat id in it
-- ARGV[1]  now (µs) or '' (Redis TIME)
-- ARGV[2]  seat TTL (µs)
-- ARGV[3]  key TTL (ms), only ever extended (see extend in conn_now.lua)
-- Reply: per key, 1 if the seat was live (and now runs until now + TTL),
-- 0 if it was expired or gone (an expired one is removed: never revived).
local ttl = ARGV[2] + 0
local key_ttl = ARGV[3] + 0
local out = {}
-- A tenant's set comes once per seat of the tenant: extend it once.
local extended = {}
for i, key in ipairs(KEYS) do
  local id = ARGV[3 + i]
  local expiry = redis.call('ZSCORE', key, id)
  if expiry and expiry + 0 > now then
    redis.call('ZADD', key, 'XX', int(now + ttl), id)
    if not extended[key] then
      extend(key, key_ttl)
      extended[key] = true
    end
    out[i] = 1
  else
    if expiry then
      redis.call('ZREM', key, id)
    end
    out[i] = 0
  end
end
return out
