-- Sliding log. KEYS[1] = ZSET of admissions (score = timestamp, member =
-- "<seq>:<cost>"), KEYS[2] = HASH {sum = sum of live costs, seq = last seq}.
-- ARGV[4] = W (window, µs), ARGV[5] = L (limit).
local log, meta = KEYS[1], KEYS[2]
local W = tonumber(ARGV[4])
local L = tonumber(ARGV[5])

local function cost_of(member)
  return tonumber(string.match(member, ':(%d+)$'))
end

-- Entries with ts <= t - W no longer count: drop them.
local horizon = int(t - W)
local used = tonumber(redis.call('HGET', meta, 'sum') or '')
if not used then
  -- No companion (first use, or lost): recount the whole log.
  used = 0
  for _, member in ipairs(redis.call('ZRANGE', log, 0, -1)) do
    used = used + cost_of(member)
  end
end
local expired = redis.call('ZRANGEBYSCORE', log, '-inf', horizon)
if #expired > 0 then
  for _, member in ipairs(expired) do
    used = used - cost_of(member)
  end
  redis.call('ZREMRANGEBYSCORE', log, '-inf', horizon)
  if redis.call('EXISTS', log) == 0 then
    used = 0
    redis.call('DEL', meta)
  elseif redis.call('EXISTS', meta) == 1 then
    -- HSET keeps the existing TTL (the meta key always has one).
    redis.call('HSET', meta, 'sum', int(used))
  end
end

if c <= L and used + c <= L then
  -- reset_after (and TTL) = newest_ts + W - t: W unless the clock stepped back.
  local newest = t
  local last = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if #last > 0 and tonumber(last[2]) > t then
    newest = tonumber(last[2])
  end
  local seq = redis.call('HINCRBY', meta, 'seq', 1)
  redis.call('ZADD', log, int(t), int(seq) .. ':' .. int(c))
  redis.call('HSET', meta, 'sum', int(used + c))
  local reset_after = newest + W - t
  expire(log, reset_after)
  expire(meta, reset_after)
  return {1, L - used - c, reset_after, 0, t}
end

-- Denied: record nothing.
local remaining = L - used
local reset_after = 0
local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
if #newest > 0 then
  reset_after = tonumber(newest[2]) + W - t
end
if c > L then
  return {0, remaining, reset_after, -1, t}
end
-- Oldest first: the first entry whose expiry frees enough gives retry_after.
local freed = 0
local start = 0
while true do
  local batch = redis.call('ZRANGE', log, start, start + 127, 'WITHSCORES')
  if #batch == 0 then
    break
  end
  for i = 1, #batch, 2 do
    freed = freed + cost_of(batch[i])
    if used - freed + c <= L then
      return {0, remaining, reset_after, tonumber(batch[i + 1]) + W - t, t}
    end
  end
  start = start + 128
end
-- Unreachable while the sum matches the log; never admit on inconsistency.
return {0, remaining, reset_after, reset_after, t}
