-- Grants one connection seat.
-- KEYS[1]  the subject's seat set (ZSET: seat id -> expiry µs)
-- KEYS[2]  the subject's fencing counter
-- KEYS[3]  (tenant form only) the tenant's seat set
-- ARGV[1]  now (µs) or '' (Redis TIME)
-- ARGV[2]  seat TTL (µs)
-- ARGV[3]  cap per subject (0: none)
-- ARGV[4]  cap per tenant (0: none)
-- ARGV[5]  the seat id
-- ARGV[6]  key TTL (ms): longer than the seat TTL; a key's TTL is only
--          ever extended (another node's seat in it may live longer)
-- ARGV[7]  the fence floor: the fence is larger (the highest token the
--          calling node was granted: kept by the node, so it holds even
--          when this store lost the subject's counter)
-- Reply: {1, fence, count, 0} granted, or {0, scope (1 subject, 2 tenant),
-- count, µs until the oldest seat expires}.
local ttl = ARGV[2] + 0
local key_ttl = ARGV[6] + 0
local function full(key, cap)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
  local count = redis.call('ZCARD', key)
  if cap > 0 and count >= cap then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    return count, math.max(oldest[2] - now, 0)
  end
  return count, nil
end
local count, wait = full(KEYS[1], ARGV[3] + 0)
if wait then
  return {0, 1, count, wait}
end
if KEYS[3] then
  local tenant_count, tenant_wait = full(KEYS[3], ARGV[4] + 0)
  if tenant_wait then
    return {0, 2, tenant_count, tenant_wait}
  end
  redis.call('ZADD', KEYS[3], int(now + ttl), ARGV[5])
  extend(KEYS[3], key_ttl)
end
-- max(last + 1, now, floor + 1): see ConnectionSeat::fence for what holds.
local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now, (tonumber(ARGV[7]) or 0) + 1)
redis.call('SET', KEYS[2], int(fence), 'PX', int(math.max(key_ttl, redis.call('PTTL', KEYS[2]))))
redis.call('ZADD', KEYS[1], int(now + ttl), ARGV[5])
extend(KEYS[1], key_ttl)
return {1, fence, count + 1, 0}
