-- tower-window: quota leases, reserve or refund, for a whole policy at once.
-- Loaded after the prelude and the algorithm fragments (not policy.lua);
-- see store/lease.rs for why the bound stays exact per algorithm.
--
-- KEYS: each quota's keys in policy order (as policy.lua), then
--   LR = HASH {seq = last lease number, ld = latest deadline of a lease
--        taken, exp = when the last record stops mattering,
--        "<t>:<seq>" = "<units>,<deadline>,<anchor 1>,..,<anchor n>,<prior 1>,..,<prior n>"}
--   (prior: the GCRA arrival time before the grant, 0 for the others)
--   LX = ZSET {"<t>:<seq>" scored by when the lease's units stop counting}
-- ARGV[1..4] and the 4 slots per quota as policy.lua, with ARGV[2] = the
-- most units wanted (reserve) or the units unused (refund); then
--   'reserve', ttl (µs), at_least
--   'refund', "<t>:<seq>" (the lease)
--
-- Reserve reply: {granted, now, deadline, seq, latest outstanding deadline
-- (0 if none is later than now), then per quota: remaining, reset_after}
-- (granted 0: no lease, nothing recorded but expired state dropped).
-- Refund reply: {units returned (0 when the lease is unknown or already
-- refunded)}.

local count = tonumber(ARGV[4])
local quotas = {}
local next_key = 1
for i = 1, count do
  local base = 4 + (i - 1) * 4
  local code = tonumber(ARGV[base + 1])
  local algorithm = ALGORITHMS[code]
  if not algorithm then
    return redis.error_reply('ERR tower-window: unknown algorithm code')
  end
  quotas[i] = {
    code = code,
    algorithm = algorithm,
    key = KEYS[next_key],
    key2 = KEYS[next_key + 1],
    p1 = tonumber(ARGV[base + 2]),
    p2 = tonumber(ARGV[base + 3]),
    p3 = tonumber(ARGV[base + 4]),
  }
  next_key = next_key + algorithm.keys
end
if next_key + 1 ~= #KEYS then
  return redis.error_reply('ERR tower-window: keys do not match the quotas')
end
local LR, LX = KEYS[next_key], KEYS[next_key + 1]
local extra = 5 + 4 * count
local mode = ARGV[extra]

if mode == 'refund' then
  local field = ARGV[extra + 1]
  local record = redis.call('HGET', LR, field)
  if not record then
    return {0}
  end
  redis.call('HDEL', LR, field)
  redis.call('ZREM', LX, field)
  local parts = {}
  for value in string.gmatch(record, '[^,]+') do
    parts[#parts + 1] = tonumber(value)
  end
  local u = math.min(c, parts[1])
  local returned = nil
  for i = 1, count do
    local q = quotas[i]
    local anchor = parts[2 + i]
    local taken = 0
    if q.code == 3 then
      local state = redis.call('HMGET', q.key, 'k', 'n')
      if tonumber(state[1] or '') == anchor then
        taken = math.min(u, tonumber(state[2] or '') or 0)
        redis.call('HSET', q.key, 'n', int((tonumber(state[2]) or 0) - taken))
      end
    elseif q.code == 2 then
      local state = redis.call('HMGET', q.key, int(anchor), 's')
      local units = tonumber(state[1] or '')
      if units and state[2] then
        taken = math.min(u, units)
        redis.call('HSET', q.key, int(anchor), int(units - taken), 's', int(tonumber(state[2]) - taken))
      end
    elseif q.code == 1 then
      local at = int(anchor)
      local same = redis.call('ZRANGEBYSCORE', q.key, at, at)
      local units = 0
      for _, member in ipairs(same) do
        units = units + log_units(member)
      end
      if units > 0 then
        taken = math.min(u, units)
        redis.call('ZREM', q.key, unpack(same))
        if units > taken then
          redis.call('ZADD', q.key, at, at .. ':' .. int(units - taken))
        end
        if redis.call('HEXISTS', q.key2, 'sum') == 1 then
          redis.call('HINCRBY', q.key2, 'sum', int(-taken))
        end
      end
    else
      -- GCRA: only while no later grant was computed from this arrival time.
      local tat = tonumber(redis.call('GET', q.key) or '')
      if tat and tat == anchor then
        taken = u
        local ttl = redis.call('PTTL', q.key)
        -- Every unit back: as if the lease never was; fewer: the grant of
        -- the rest, still dated at the deadline.
        local value = int(tat - u * q.p1)
        if u >= parts[1] then
          value = int(parts[2 + count + i])
        end
        if ttl > 0 then
          redis.call('SET', q.key, value, 'PX', ttl)
        else
          redis.call('SET', q.key, value)
          expire(q.key, tat - t)
        end
      end
    end
    if not returned or taken < returned then
      returned = taken
    end
  end
  return {returned or 0}
end

if mode ~= 'reserve' then
  return redis.error_reply('ERR tower-window: unknown lease mode')
end

local want = c
local ttl = tonumber(ARGV[extra + 1])
local at_least = tonumber(ARGV[extra + 2])
if not ttl or ttl < 1 or not at_least or at_least < 1 or want < at_least then
  return redis.error_reply('ERR tower-window: invalid lease request')
end

-- The deadline: at most the end of the window (fixed window) or bucket
-- (sliding counter) that will count the units.
local d = t + ttl
for i = 1, count do
  local q = quotas[i]
  local width = nil
  if q.code == 3 then
    width = q.p1
  elseif q.code == 2 then
    width = q.p3
  end
  if width then
    local cap = (idiv(t, width) + 1) * width
    if cap < d then
      d = cap
    end
  end
end
for i = 1, count do
  local q = quotas[i]
  if q.code == 4 and (d - t) + q.p1 > q.p1 * q.p2 then
    return redis.error_reply('ERR tower-window: lease ttl leaves no room in a gcra quota')
  end
end

-- Room in every quota: evaluate a cost of 0 (drops expired state; the
-- remaining before is the limit minus what counts now, future log entries
-- included); GCRA dates the tokens at the deadline.
c = 0
local room = nil
for i = 1, count do
  local q = quotas[i]
  local r
  if q.code == 4 then
    local T, B = q.p1, q.p2
    local tat = tonumber(redis.call('GET', q.key) or '')
    local from = d
    if tat and tat > from then
      from = tat
    end
    q.from = from
    r = idiv(t + B * T - from, T)
  else
    q.algorithm.evaluate(q)
    r = q.remaining0
  end
  if r < 0 then
    r = 0
  end
  q.room = r
  if not room or r < room then
    room = r
  end
end

-- Records whose units stopped counting.
local dead = redis.call('ZRANGEBYSCORE', LX, '-inf', int(t))
if #dead > 0 then
  redis.call('HDEL', LR, unpack(dead))
  redis.call('ZREMRANGEBYSCORE', LX, '-inf', int(t))
end

-- At most half the room (rounded up) unless that is below at_least: one
-- lease cannot take the whole remaining budget while other nodes wait.
local share = idiv(room + 1, 2)
if share < at_least then
  share = at_least
end
local g = math.min(room, share, want)
local ld = tonumber(redis.call('HGET', LR, 'ld') or '')
if g < at_least then
  for i = 1, count do
    local q = quotas[i]
    if q.dirty and q.algorithm.settle then
      q.algorithm.settle(q)
    end
  end
  local held = 0
  if ld and ld > t then
    held = ld
  end
  return {0, t, 0, 0, held}
end

c = g
local anchors = {}
local priors = {}
local reply_tail = {}
local last = 0
for i = 1, count do
  local q = quotas[i]
  local anchor, stops
  local prior = 0
  if q.code == 3 then
    q.algorithm.commit(q)
    anchor = q.window
    stops = (q.window + 1) * q.p1
  elseif q.code == 2 then
    q.algorithm.commit(q)
    anchor = q.b
    stops = (q.b + idiv(q.p1, q.p3) + 1) * q.p3
  elseif q.code == 1 then
    -- Recorded at the deadline: commit as if now were d.
    local real = t
    local newest = d
    if q.newest and q.newest > d then
      newest = q.newest
    end
    q.newest_after = newest
    q.reset = newest + q.p1 - real
    t = d
    q.algorithm.commit(q)
    t = real
    anchor = d
    stops = d + q.p1
  else
    local tat = q.from + g * q.p1
    prior = tonumber(redis.call('GET', q.key) or '') or 0
    redis.call('SET', q.key, int(tat))
    expire(q.key, tat - t)
    anchor = tat
    stops = tat
  end
  anchors[#anchors + 1] = int(anchor)
  priors[#priors + 1] = int(prior)
  reply_tail[#reply_tail + 1] = q.room - g
  reply_tail[#reply_tail + 1] = stops - t
  if stops > last then
    last = stops
  end
end

local seq = redis.call('HINCRBY', LR, 'seq', 1)
local field = int(t) .. ':' .. int(seq)
redis.call('HSET', LR, field, int(g) .. ',' .. int(d) .. ',' .. table.concat(anchors, ',') .. ',' .. table.concat(priors, ','))
redis.call('ZADD', LX, int(last), field)
if not ld or ld < d then
  ld = d
end
local exp = tonumber(redis.call('HGET', LR, 'exp') or '')
if not exp or exp < last then
  exp = last
end
redis.call('HSET', LR, 'ld', int(ld), 'exp', int(exp))
expire(LR, exp - t)
expire(LX, exp - t)

local reply = {g, t, d, seq, ld}
for i = 1, #reply_tail do
  reply[#reply + 1] = reply_tail[i]
end
return reply
