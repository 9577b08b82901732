-- Sliding log (code 1). Two keys: q.key = ZSET of admissions, score = the
-- timestamp, member = "<timestamp>:<units>" (admissions in the same
-- microsecond share one member, like the slots of algorithm/timeline.rs, so
-- members are unique by construction); q.key2 = HASH {sum = units of the
-- live entries, newest = the highest timestamp in the log}, a cache that is
-- rebuilt from the log when missing. Parameters: p1 = W (window, µs), p2 =
-- L (limit). An entry at ts counts while t < ts + W.
local function log_units(member)
  return tonumber(string.match(member, ':(%d+)$')) or 0
end

ALGORITHMS[1] = {
  keys = 2,
  evaluate = function(q)
    local log, meta = q.key, q.key2
    local W, L = q.p1, q.p2
    local cached = redis.call('HMGET', meta, 'sum', 'newest')
    local used = tonumber(cached[1] or '')
    local newest = tonumber(cached[2] or '')
    -- The oldest entries: whether the log is empty, which of them expired,
    -- and (on a denial, when none did) the retry walk's first batch.
    local oldest = redis.call('ZRANGE', log, 0, 1, 'WITHSCORES')
    local empty = #oldest == 0
    -- The expired entries (a table only when there are some).
    local expired = nil
    if not empty and oldest[2] + 0 <= t - W then
      local horizon = int(t - W)
      if #oldest == 4 and oldest[4] + 0 <= t - W then
        expired = redis.call('ZRANGEBYSCORE', log, '-inf', horizon)
      else
        expired = {oldest[1]}
      end
      redis.call('ZREMRANGEBYSCORE', log, '-inf', horizon)
      oldest = nil
    end
    q.missing = not used
    q.dirty = expired ~= nil or q.missing
    if empty then
      used, newest = 0, nil
    elseif used then
      if expired then
        for i = 1, #expired do
          used = used - log_units(expired[i])
        end
      end
    else
      -- No companion (first use, or lost): recount the live log.
      used = 0
      for _, member in ipairs(redis.call('ZRANGE', log, 0, -1)) do
        used = used + log_units(member)
      end
      newest = nil
    end
    if not empty and not newest then
      local last = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
      if #last > 0 then
        newest = tonumber(last[2])
      end
      q.dirty = true
    end
    if newest and newest <= t - W then
      -- Everything expired.
      newest = nil
    end
    if not newest then
      used = 0
    end
    q.used, q.newest = used, newest
    local reset = 0
    if newest then
      reset = newest + W - t
    end
    if c > L then
      return denied(q, L - used, reset, -1)
    end
    if used + c <= L then
      -- reset (and TTL) = newest + W - t: W unless the clock stepped back.
      local newest_after = t
      if newest and newest > t then
        newest_after = newest
      end
      q.newest_after = newest_after
      return fits(q, L - used - c, newest_after + W - t, L - used, reset)
    end
    -- Denied: oldest first, the first entry whose expiry frees enough,
    -- among the oldest MAX_RETRY_WALK entries, read in doubling batches
    -- (a small cost is usually freed by the first few).
    local freed = 0
    local first, size = 0, 2
    while first < MAX_RETRY_WALK do
      local last = math.min(first + size, MAX_RETRY_WALK) - 1
      local batch = oldest
      if not batch or first > 0 then
        batch = redis.call('ZRANGE', log, first, last, 'WITHSCORES')
      end
      for i = 1, #batch, 2 do
        freed = freed + log_units(batch[i])
        if used - freed + c <= L then
          return denied(q, L - used, reset, tonumber(batch[i + 1]) + W - t)
        end
      end
      if #batch < 2 * (last - first + 1) then
        break
      end
      first, size = last + 1, size * 2
    end
    return denied(q, L - used, reset, reset)
  end,
  commit = function(q)
    local log, meta = q.key, q.key2
    local now = int(t)
    local units = c
    -- Entries of this microsecond merge into one (there is one only if the
    -- newest entry is not older than now).
    if q.newest and q.newest >= t then
      local same = redis.call('ZRANGEBYSCORE', log, now, now)
      if #same > 0 then
        for _, member in ipairs(same) do
          units = units + log_units(member)
        end
        -- Exactly the members just read, without unpack (bounded only by
        -- construction: one member per microsecond).
        redis.call('ZREMRANGEBYSCORE', log, now, now)
      end
    end
    redis.call('ZADD', log, now, now .. ':' .. int(units))
    redis.call('HSET', meta, 'sum', int(q.used + c), 'newest', int(q.newest_after))
    local ttl = ttl_ms(q.reset)
    redis.call('PEXPIRE', log, ttl)
    redis.call('PEXPIRE', meta, ttl)
  end,
  settle = function(q)
    local meta = q.key2
    if not q.newest then
      if not q.missing then
        redis.call('DEL', meta)
      end
      return
    end
    -- HSET keeps an existing TTL; a recreated companion takes the log's.
    redis.call('HSET', meta, 'sum', int(q.used), 'newest', int(q.newest))
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
