-- Sliding counter (code 2). One key: HASH {"<j>" = units admitted in bucket
-- j = floor(ts / G), s = units in all buckets kept, l = lowest bucket index
-- that may still be kept (every bucket below it is gone), h = highest bucket
-- index written}. Parameters: p1 = W (µs), p2 = L, p3 = G (bucket width, µs;
-- divides W). Bucket j counts while t < (j + n + 1) * G, n = W / G, i.e. the
-- buckets j >= floor(t / G) - n.
--
-- Amortized O(1): a call reads s, l and h, and deletes only the buckets that
-- expired since the last call (the whole key when even h has), never the
-- whole hash.

-- Field names of the buckets first..last.
local function bucket_fields(first, last)
  local fields = {}
  for j = first, last do
    fields[#fields + 1] = int(j)
  end
  return fields
end

ALGORITHMS[2] = {
  keys = 1,
  evaluate = function(q)
    local key = q.key
    local W, L, G = q.p1, q.p2, q.p3
    local n = idiv(W, G)
    local b = idiv(t, G)
    local lowest = b - n
    -- With the state, read bucket `lowest` (the first a denial's retry walk
    -- looks at whenever the kept buckets start there: always, once anything
    -- expired)
    -- and bucket b, which an admission adds to.
    local state = redis.call('HMGET', key, 's', 'l', 'h', int(lowest), int(b))
    local used = tonumber(state[1] or '')
    local lo = tonumber(state[2] or '')
    local hi = tonumber(state[3] or '')
    if not (used and lo and hi) then
      used, lo, hi = 0, nil, nil
      if redis.call('EXISTS', key) == 1 then
        -- A hash without its running fields (written by an older version):
        -- rebuild them once.
        local raw = redis.call('HGETALL', key)
        for i = 1, #raw, 2 do
          local j = tonumber(raw[i])
          if j then
            used = used + (tonumber(raw[i + 1]) or 0)
            if not lo or j < lo then
              lo = j
            end
            if not hi or j > hi then
              hi = j
            end
          end
        end
        q.dirty = true
      end
    end
    if hi and hi < lowest then
      -- Everything expired (idle for longer than the window).
      redis.call('DEL', key)
      used, lo, hi = 0, nil, nil
      q.dirty = false
    elseif lo and lo < lowest then
      -- Drop the buckets that expired since the last call.
      local first = lo
      while first < lowest do
        local last = math.min(first + 127, lowest - 1)
        local fields = bucket_fields(first, last)
        local counts = redis.call('HMGET', key, unpack(fields))
        local dead = {}
        for i = 1, #fields do
          if counts[i] then
            used = used - (tonumber(counts[i]) or 0)
            dead[#dead + 1] = fields[i]
          end
        end
        if #dead > 0 then
          redis.call('HDEL', key, unpack(dead))
        end
        first = last + 1
      end
      lo = lowest
      q.dirty = true
    end
    q.b, q.used, q.lo, q.hi = b, used, lo, hi
    -- Bucket b's units (the sweep never deletes it: b >= lowest).
    q.units = tonumber(state[5] or '') or 0
    if not q.lo then
      q.units = 0
    end
    local reset = 0
    if hi then
      reset = (hi + n + 1) * G - t
    end
    if c > L then
      return denied(q, L - used, reset, -1)
    end
    if used + c <= L then
      -- reset (and TTL) from the newest bucket: b unless the clock stepped back.
      local newest = b
      if hi and hi > b then
        newest = hi
      end
      return fits(q, L - used - c, (newest + n + 1) * G - t, L - used, reset)
    end
    if not lo then
      return denied(q, L - used, reset, reset)
    end
    -- Denied: walk the non-empty buckets upward from the lowest kept one,
    -- at most MAX_RETRY_WALK of them and n + 1 bucket reads in all.
    -- Buckets are read in doubling batches: a small cost is usually freed
    -- by the first few.
    local freed, seen = 0, 0
    local stop = math.min(hi, lo + n)
    local first, size = lo, 4
    if lo == lowest then
      if state[4] then
        seen, freed = 1, tonumber(state[4]) or 0
        if used - freed + c <= L then
          return denied(q, L - used, reset, (lowest + n + 1) * G - t)
        end
      end
      first = lowest + 1
    end
    while first <= stop and seen < MAX_RETRY_WALK do
      local last = math.min(first + size - 1, stop)
      size = math.min(size * 2, 128)
      local counts = redis.call('HMGET', key, unpack(bucket_fields(first, last)))
      for i = 1, last - first + 1 do
        if counts[i] then
          seen = seen + 1
          freed = freed + (tonumber(counts[i]) or 0)
          if used - freed + c <= L then
            return denied(q, L - used, reset, (first + i - 1 + n + 1) * G - t)
          end
          if seen >= MAX_RETRY_WALK then
            break
          end
        end
      end
      first = last + 1
    end
    return denied(q, L - used, reset, reset)
  end,
  commit = function(q)
    local b = q.b
    local lo, hi = q.lo, q.hi
    if not lo or b < lo then
      lo = b
    end
    if not hi or b > hi then
      hi = b
    end
    redis.call('HSET', q.key, int(b), int(q.units + c), 's', int(q.used + c), 'l', int(lo), 'h', int(hi))
    expire(q.key, q.reset)
  end,
  settle = function(q)
    -- HSET keeps the key's TTL.
    if q.lo and q.hi then
      redis.call('HSET', q.key, 's', int(q.used), 'l', int(q.lo), 'h', int(q.hi))
    end
  end,
}
