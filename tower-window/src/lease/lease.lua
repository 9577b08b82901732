-- tower-window: quota leases, reserve or refund, for a whole policy at once.
-- Loaded after the prelude, the algorithm fragments and take_back.lua (not
-- policy.lua);
-- see store/lease.rs for why the bound stays exact per algorithm, and what
-- a lease means for a shadow quota.
--
-- KEYS: each quota's keys in policy order (as policy.lua), then
--   LR = HASH {seq = last lease number, ld = latest deadline of a lease
--        taken, exp = when the last record stops mattering,
--        "<t>:<seq>" = "<units>,<deadline>,<anchor 1>,..,<anchor n>,<prior 1>,..,<prior n>,<held 1>,..,<held n>"}
--   (prior: the GCRA arrival time before the grant, 0 for the others;
--   held: the units quota i holds, fewer than <units> for a shadow quota;
--   a record without them, written by an older version, holds <units> in
--   every quota)
--   LX = ZSET {"<t>:<seq>" scored by when the lease's units stop counting}
-- ARGV[1..4] and the 4 slots per quota as policy.lua (a shadow quota's code
-- carries SHADOW_FLAG), with ARGV[2] = the most units wanted (reserve; 0
-- reserves nothing) or the units unused (refund); then
--   'reserve', ttl (µs), at_least, max_wait (µs, read for GCRA only),
--     decides (1: a reservation that grants nothing decides a check of
--     at_least units as policy.lua would), the number of refunds r, then r
--     refunds applied first, each "<t>:<seq>", units unused, then per quota
--     the units it still holds unspent ('' unnamed: see below)
--   'refund', "<t>:<seq>" (the lease)[, then per quota the units it still
--     holds unspent, read for shadow quotas; without them a shadow quota
--     gets back what it held beyond the units spent]
--
-- Reserve reply: {granted, now, deadline, seq, latest outstanding deadline
-- (0 if none is later than now), units the refunds returned, then with a
-- lease per quota: remaining, reset_after, units held, then the time from
-- which the lease may be spent; without one (granted 0: nothing recorded
-- but expired state dropped), for a reservation that decides, policy.lua's
-- reply for the check}. Only the enforced quotas size the grant (with none,
-- it is the units wanted); a shadow quota holds what it has room for.
-- Refund reply: {units returned to the enforced quotas (the least of
-- them; with shadow quotas only, the units unused), 0 when the lease is
-- unknown, already refunded, or its units all stopped counting}.
--
-- Bounded work whatever the history: each call drops at most MAX_DEAD
-- records that stopped counting, and a refund reads at most MAX_MEMBERS
-- log entries at the lease's timestamp.

local MAX_DEAD = 128

begin()
local quotas, invalid = read_quotas(nil, 0, 2)
if not quotas then
  return invalid
end
local count = #quotas
local enforced = 0
for i = 1, count do
  if not quotas[i].shadow then
    enforced = enforced + 1
  end
end
local LR, LX = KEYS[#KEYS - 1], KEYS[#KEYS]
local extra = 5 + 4 * count
local mode = ARGV[extra]

-- Drops a bounded batch of the records whose units stopped counting (the
-- oldest first); the rest go with later calls, or with the keys' TTL.
local function drop_dead()
  local dead = redis.call('ZRANGEBYSCORE', LX, '-inf', int(t), 'LIMIT', 0, MAX_DEAD)
  if #dead > 0 then
    redis.call('HDEL', LR, unpack(dead))
    redis.call('ZREM', LX, unpack(dead))
  end
end

-- Refunds `unused` units of the lease named `field`; `named(i)` is what
-- quota i still holds unspent, if the caller says (read for shadow
-- quotas). Answers the units returned to the enforced quotas (the least of
-- them; with shadow quotas only, the units unused), 0 when the lease is
-- unknown, already refunded, or its units all stopped counting.
local function refund(field, unused, named)
  local record = redis.call('HGET', LR, field)
  if not record then
    return 0
  end
  local stops = tonumber(redis.call('ZSCORE', LX, field) or '')
  redis.call('HDEL', LR, field)
  redis.call('ZREM', LX, field)
  if stops and stops <= t then
    -- Its units all stopped counting: nothing to give back.
    return 0
  end
  local parts = {}
  for value in string.gmatch(record, '[^,]+') do
    parts[#parts + 1] = tonumber(value)
  end
  local granted = parts[1]
  local u = math.min(unused, granted)
  local returned = nil
  for i = 1, count do
    local q = quotas[i]
    local anchor = parts[2 + i]
    local prior = parts[2 + count + i] or 0
    local held = parts[2 + 2 * count + i] or granted
    local units = math.min(u, held)
    if q.shadow then
      local units_named = named(i)
      if units_named then
        units = math.min(math.max(units_named, 0), held)
      else
        -- It held the first units spent.
        units = held - math.min(held, granted - u)
      end
    end
    local taken = 0
    if units > 0 and anchor then
      taken = take_back(q, anchor, prior, held, units)
    end
    if not q.shadow and (not returned or taken < returned) then
      returned = taken
    end
  end
  if enforced == 0 then
    returned = u
  end
  return returned or 0
end

if mode == 'refund' then
  drop_dead()
  return {refund(ARGV[extra + 1], c, function(i)
    return tonumber(ARGV[extra + 1 + i] or '')
  end)}
end

if mode ~= 'reserve' then
  return redis.error_reply('ERR tower-window: unknown lease mode')
end

local want = c
local ttl = tonumber(ARGV[extra + 1])
local at_least = tonumber(ARGV[extra + 2])
if not ttl or ttl < 1 or not at_least or at_least < 1 or (want ~= 0 and want < at_least) then
  return redis.error_reply('ERR tower-window: invalid lease request')
end
local decides = ARGV[extra + 4] == '1'

-- The refunds first: the reservation sees the room they free.
drop_dead()
local refunded = 0
local refunds = tonumber(ARGV[extra + 5] or '0') or 0
for r = 1, refunds do
  local at = extra + 6 + (r - 1) * (2 + count)
  refunded = refunded + refund(ARGV[at], tonumber(ARGV[at + 1]) or 0, function(i)
    return tonumber(ARGV[at + 1 + i] or '')
  end)
end

-- The deadline: at most the end of the window (fixed window) or bucket
-- (sliding counter) that will count the units, shadow quotas included (so
-- they count as they would enforced).
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
-- included); GCRA dates the tokens at the deadline. Only the enforced
-- quotas' room bounds the grant.
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
    q.reset0 = 0
    if tat and tat > t then
      q.reset0 = tat - t
    end
    r = idiv(t + B * T - from, T)
  else
    q.algorithm.evaluate(q)
    r = q.remaining0
  end
  if r < 0 then
    r = 0
  end
  q.room = r
  if not q.shadow and (not room or r < room) then
    room = r
  end
end

-- At most half the room (rounded up) unless that is below at_least: one
-- lease cannot take the whole remaining budget while other nodes wait.
-- All of it when every enforced quota is a sliding log: its room comes
-- back in the pieces earlier leases took, and halving them would split
-- the pieces again every window (see `crate::lease`).
local g = want
if room then
  local share = idiv(room + 1, 2)
  local all_logs = true
  for i = 1, count do
    if not quotas[i].shadow and quotas[i].code ~= 1 then
      all_logs = false
    end
  end
  if all_logs then
    share = room
  end
  if share < at_least then
    share = at_least
  end
  g = math.min(room, share, want)
end
-- A GCRA policy's lease that may start later (see `crate::lease`, "GCRA
-- leases that start later"): when the room now grants fewer than wanted,
-- up to `want` of the tokens the buckets free within `wait`, spendable
-- from nb = max(t, tat + g T - B T) (the latest of the quotas) until
-- nb + ttl, taken and dated as any lease's.
local nb = t
local wait = tonumber(ARGV[extra + 3] or '0') or 0
if wait > 0 and g < want then
  local gl = want
  for i = 1, count do
    local q = quotas[i]
    if q.code ~= 4 or q.shadow then
      gl = 0
      break
    end
    local T, B = q.p1, q.p2
    q.tat_now = tonumber(redis.call('GET', q.key) or '') or 0
    gl = math.min(gl, idiv(B * T - ttl, T), idiv(t + wait + B * T - q.tat_now, T))
  end
  if gl > g and gl >= at_least then
    for i = 1, count do
      local q = quotas[i]
      local start = q.tat_now + gl * q.p1 - q.p1 * q.p2
      if start > nb then
        nb = start
      end
    end
    g = gl
    d = nb + ttl
    for i = 1, count do
      local q = quotas[i]
      q.from = math.max(q.tat_now, d)
    end
  end
end

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
  local reply = {0, t, 0, 0, held, refunded}
  if decides then
    -- Nothing to lease: the check is decided here, as policy.lua would.
    local check = {}
    for i = 1, count do
      local q = quotas[i]
      check[i] = {
        algorithm = q.algorithm,
        shadow = q.shadow,
        key = q.key,
        key2 = q.key2,
        p1 = q.p1,
        p2 = q.p2,
        p3 = q.p3,
        c = at_least,
      }
    end
    for _, value in ipairs(decide(check)) do
      reply[#reply + 1] = value
    end
  end
  return reply
end

local anchors = {}
local priors = {}
local holds = {}
local reply_tail = {}
local last = d
for i = 1, count do
  local q = quotas[i]
  -- An enforced quota holds the grant; a shadow quota what it has room for.
  local h = g
  if q.shadow and q.room < g then
    h = q.room
  end
  local anchor, stops
  local prior = 0
  local reset
  if h == 0 then
    -- A full shadow quota holds nothing, and reads as it stands.
    if q.dirty and q.algorithm.settle then
      q.algorithm.settle(q)
    end
    anchor = 0
    reset = q.reset0
  else
    c = h
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
      local tat = q.from + h * q.p1
      prior = tonumber(redis.call('GET', q.key) or '') or 0
      redis.call('SET', q.key, int(tat))
      expire(q.key, tat - t)
      anchor = tat
      stops = tat
    end
    reset = stops - t
    if stops > last then
      last = stops
    end
  end
  anchors[#anchors + 1] = int(anchor)
  priors[#priors + 1] = int(prior)
  holds[#holds + 1] = int(h)
  reply_tail[#reply_tail + 1] = q.room - h
  reply_tail[#reply_tail + 1] = reset
  reply_tail[#reply_tail + 1] = h
end

local seq = redis.call('HINCRBY', LR, 'seq', 1)
local field = int(t) .. ':' .. int(seq)
redis.call('HSET', LR, field, int(g) .. ',' .. int(d) .. ',' .. table.concat(anchors, ',') .. ',' .. table.concat(priors, ',') .. ',' .. table.concat(holds, ','))
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

local reply = {g, t, d, seq, ld, refunded}
for i = 1, #reply_tail do
  reply[#reply + 1] = reply_tail[i]
end
reply[#reply + 1] = nb
return reply
