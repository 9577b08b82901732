-- Sliding log (code 1). Two keys: q.key = ZSET of admissions, score = the
-- timestamp, member = "<timestamp>:<units>" (admissions in the same
-- microsecond share one member, like the slots of algorithm/timeline.rs, so
-- members are unique by construction); q.key2 = HASH {sum = units of the
-- live entries}, recounted from the log when missing. Parameters: p1 = W
-- (window, µs), p2 = L (limit). An entry at ts counts while t < ts + W.
local function log_units(member)
  return tonumber(string.match(member, ':(%d+)$')) or 0
end

ALGORITHMS[1] = {
  keys = 2,
  evaluate = function(q)
    local log, meta = q.key, q.key2
    local W, L = q.p1, q.p2
    local horizon = int(t - W)
    local used = tonumber(redis.call('HGET', meta, 'sum') or '')
    local expired = redis.call('ZRANGEBYSCORE', log, '-inf', horizon)
    if #expired > 0 then
      redis.call('ZREMRANGEBYSCORE', log, '-inf', horizon)
    end
    q.missing = not used
    if used then
      for _, member in ipairs(expired) do
        used = used - log_units(member)
      end
    else
      -- No companion (first use, or lost): recount the live log.
      used = 0
      for _, member in ipairs(redis.call('ZRANGE', log, 0, -1)) do
        used = used + log_units(member)
      end
    end
    local last = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
    local newest = nil
    local reset = 0
    if #last > 0 then
      newest = tonumber(last[2])
      reset = newest + W - t
    else
      used = 0
    end
    q.used, q.empty = used, #last == 0
    q.dirty = #expired > 0 or q.missing
    if c > L then
      return denied(q, L - used, reset, -1)
    end
    if used + c <= L then
      -- reset (and TTL) = newest + W - t: W unless the clock stepped back.
      local newest_after = t
      if newest and newest > t then
        newest_after = newest
      end
      return fits(q, L - used - c, newest_after + W - t, L - used, reset)
    end
    -- Denied: oldest first, the first entry whose expiry frees enough.
    local freed = 0
    local oldest = redis.call('ZRANGE', log, 0, MAX_RETRY_WALK - 1, 'WITHSCORES')
    for i = 1, #oldest, 2 do
      freed = freed + log_units(oldest[i])
      if used - freed + c <= L then
        return denied(q, L - used, reset, tonumber(oldest[i + 1]) + W - t)
      end
    end
    return denied(q, L - used, reset, reset)
  end,
  commit = function(q)
    local log, meta = q.key, q.key2
    local now = int(t)
    local units = c
    local same = redis.call('ZRANGEBYSCORE', log, now, now)
    if #same > 0 then
      for _, member in ipairs(same) do
        units = units + log_units(member)
      end
      redis.call('ZREM', log, unpack(same))
    end
    redis.call('ZADD', log, now, now .. ':' .. int(units))
    redis.call('HSET', meta, 'sum', int(q.used + c))
    expire(log, q.reset)
    expire(meta, q.reset)
  end,
  settle = function(q)
    local meta = q.key2
    if q.empty then
      if not q.missing then
        redis.call('DEL', meta)
      end
      return
    end
    -- HSET keeps an existing TTL; a recreated companion takes the log's.
    redis.call('HSET', meta, 'sum', int(q.used))
    if q.missing then
      local ttl = redis.call('PTTL', q.key)
      if ttl > 0 then
        redis.call('PEXPIRE', meta, ttl)
      else
        expire(meta, q.reset)
      end
    end
  end,
}
