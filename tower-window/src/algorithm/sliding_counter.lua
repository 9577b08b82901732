-- Sliding counter (code 2). One key: HASH {"<j>" = units admitted in bucket
-- j = floor(ts / G), s = units in all buckets kept, l = lowest bucket index
-- that may still be kept (every bucket below it is gone), h = highest bucket
-- index written}. Parameters: p1 = W (µs), p2 = L, p3 = G (bucket width, µs;
-- divides W). Bucket j counts while t < (j + n + 1) * G, n = W / G, i.e. the
-- buckets j >= floor(t / G) - n.
--
-- Amortized O(1): a call reads s, l and h, and deletes only the buckets that
-- expired since the last call (the whole key when even h has).
--
-- Bounded by the state held, never by the distance between two times: a
-- range of bucket indices is read field by field (128 per HMGET) only while
-- it is no wider than the hash; a wider one (after the clock stepped back
-- and forward again, kept buckets can be days of buckets apart) is read
-- from the whole hash at once (HGETALL), which holds the live buckets only.

-- Field names of the buckets first..last.
local function bucket_fields(first, last)
  local fields = {}
  for j = first, last do
    fields[#fields + 1] = int(j)
  end
  return fields
end

-- Whether the buckets first..last are cheaper to read from the whole hash
-- than one by one: the range is wider than one batch and than the hash.
local function sparse(key, first, last)
  local width = last - first + 1
  return width > 128 and width > redis.call('HLEN', key)
end

-- The buckets first..last that exist, ascending: {{j, field, units}, ...},
-- from the whole hash (see sparse).
local function buckets_in(key, first, last)
  local raw = redis.call('HGETALL', key)
  local found = {}
  for i = 1, #raw, 2 do
    -- s, l and h are not numbers.
    local j = tonumber(raw[i])
    if j and j >= first and j <= last then
      found[#found + 1] = {j, raw[i], tonumber(raw[i + 1]) or 0}
    end
  end
  table.sort(found, function(x, y)
    return x[1] < y[1]
  end)
  return found
end

-- HDEL of `fields`, 128 at a time (unpack takes a bounded number).
local function delete_fields(key, fields)
  for first = 1, #fields, 128 do
    redis.call('HDEL', key, unpack(fields, first, math.min(first + 127, #fields)))
  end
end

-- Deletes the buckets first..last that exist; answers the units they held.
local function drop_buckets(key, first, last)
  local freed = 0
  local dead = {}
  if sparse(key, first, last) then
    for _, bucket in ipairs(buckets_in(key, first, last)) do
      freed = freed + bucket[3]
      dead[#dead + 1] = bucket[2]
    end
    delete_fields(key, dead)
    return freed
  end
  while first <= last do
    local stop = math.min(first + 127, last)
    local fields = bucket_fields(first, stop)
    local counts = redis.call('HMGET', key, unpack(fields))
    for i = 1, #fields do
      if counts[i] then
        freed = freed + (tonumber(counts[i]) or 0)
        dead[#dead + 1] = fields[i]
      end
    end
    delete_fields(key, dead)
    dead = {}
    first = stop + 1
  end
  return freed
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
      used = used - drop_buckets(key, lo, lowest - 1)
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
    -- Denied: walk the kept buckets upward from the lowest kept one to the
    -- highest (past b only after the clock stepped back), at most
    -- MAX_RETRY_WALK of them, like the Rust twin. Buckets are read in
    -- doubling batches (a small cost is usually freed by the first few),
    -- or all at once when the range is sparse.
    local freed, seen = 0, 0
    local stop = hi
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
    if first == b and stop == b then
      -- Only bucket b is left to walk: read with the state.
      if state[5] then
        freed = freed + (tonumber(state[5]) or 0)
        if used - freed + c <= L then
          return denied(q, L - used, reset, (b + n + 1) * G - t)
        end
      end
      return denied(q, L - used, reset, reset)
    end
    if first <= stop and sparse(key, first, stop) then
      for _, bucket in ipairs(buckets_in(key, first, stop)) do
        if seen >= MAX_RETRY_WALK then
          break
        end
        seen = seen + 1
        freed = freed + bucket[3]
        if used - freed + c <= L then
          return denied(q, L - used, reset, (bucket[1] + n + 1) * G - t)
        end
      end
      return denied(q, L - used, reset, reset)
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
