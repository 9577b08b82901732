-- Taking back units a reservation recorded and did not use, where they
-- still count: a lease's refund (lease.lua) and a settle (settle.lua).
-- Each q holds q.code (the algorithm's code) besides the fields the
-- algorithms read.
--
-- Bounded work whatever the history: a sliding log's take-back reads at
-- most MAX_MEMBERS log entries at the reservation's timestamp.

local MAX_MEMBERS = 128

-- Sliding log: takes back up to `units` of the entries at `at`. There is
-- one entry per timestamp by construction; a log written otherwise is read
-- in at most MAX_MEMBERS of them (giving back less is always safe).
local function log_take_back(q, at, units)
  local same = redis.call('ZRANGEBYSCORE', q.key, at, at, 'LIMIT', 0, MAX_MEMBERS)
  local found = 0
  for _, member in ipairs(same) do
    found = found + log_units(member)
  end
  if found == 0 then
    return 0
  end
  local taken = math.min(units, found)
  redis.call('ZREM', q.key, unpack(same))
  -- The rest as one entry, kept at 0 units when nothing is left (as the
  -- embedded store keeps its slot: the window's reset still counts from
  -- it). An entry of that name among those not read merges in (its units
  -- are the rest's, so the rest doubles: a few rounds at most).
  local rest = found - taken
  for _ = 1, 64 do
    local member = at .. ':' .. int(rest)
    if not redis.call('ZSCORE', q.key, member) then
      redis.call('ZADD', q.key, at, member)
      break
    end
    redis.call('ZREM', q.key, member)
    rest = rest * 2
  end
  if redis.call('HEXISTS', q.key2, 'sum') == 1 then
    redis.call('HINCRBY', q.key2, 'sum', int(-taken))
  end
  return taken
end

-- Takes back up to `u` of the `held` units quota q holds of a lease,
-- where they still count; answers how many.
local function take_back(q, anchor, prior, held, u)
  if q.code == 3 then
    local state = redis.call('HMGET', q.key, 'k', 'n')
    if tonumber(state[1] or '') == anchor then
      local taken = math.min(u, tonumber(state[2] or '') or 0)
      redis.call('HSET', q.key, 'n', int((tonumber(state[2]) or 0) - taken))
      return taken
    end
    return 0
  elseif q.code == 2 then
    local state = redis.call('HMGET', q.key, int(anchor), 's')
    local units = tonumber(state[1] or '')
    if units and state[2] then
      local taken = math.min(u, units)
      redis.call('HSET', q.key, int(anchor), int(units - taken), 's', int(tonumber(state[2]) - taken))
      return taken
    end
    return 0
  elseif q.code == 1 then
    return log_take_back(q, int(anchor), u)
  end
  -- GCRA: only while no later grant was computed from this arrival time.
  local tat = tonumber(redis.call('GET', q.key) or '')
  if not (tat and tat == anchor) then
    return 0
  end
  local ttl = redis.call('PTTL', q.key)
  -- Every unit back: as if the lease never was; fewer: the grant of the
  -- rest, still dated at the deadline.
  local value = int(tat - u * q.p1)
  if u >= held then
    value = int(prior)
  end
  if ttl > 0 then
    redis.call('SET', q.key, value, 'PX', ttl)
  else
    redis.call('SET', q.key, value)
    expire(q.key, tat - t)
  end
  return u
end
