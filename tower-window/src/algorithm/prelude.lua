-- tower-window: shared prelude. The script is this file, then one fragment
-- per algorithm (each registers itself in ALGORITHMS), then policy.lua, which
-- documents KEYS, ARGV and the reply (or lease.lua, peek.lua, settle.lua).
--
-- Everything before that last file only defines: as a Redis Function it runs
-- once, when the library is loaded (store/redis/script.rs). The last file
-- decides one call and starts with begin(), which reads the call's clock,
-- cost and lowest TTL into t, c and MIN_TTL_MS.
--
-- Time is integer microseconds throughout. Lua 5.1 numbers are doubles, exact
-- for integers below 2^53 (~285 years of microseconds since 1970), so every
-- value is kept an integer: divisions go through idiv, and numbers are sent
-- to Redis as "%d" strings (tostring would print 1.7e+15).
--
-- As a function, a call runs only the body: what it costs beyond the
-- commands it issues is kept small. Arguments laid out by the caller are
-- read with `+ 0` (one conversion; tonumber converts twice) where they are
-- always numbers; tonumber stays where a value may be missing or stored.

local function int(x)
  return string.format('%d', x)
end

-- floor(a / b) for integers, exact even where the double quotient rounds.
local function idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

-- The call's time (µs), cost, and lowest TTL (ms): set by begin().
local t, c, MIN_TTL_MS

local function now_micros()
  if ARGV[1] ~= '' then
    return ARGV[1] + 0
  end
  local time = redis.call('TIME')
  return time[1] * 1000000 + time[2]
end

-- A TTL in whole milliseconds, rounded up, at least 1 (and MIN_TTL_MS).
local function ttl_ms(micros)
  local ms = idiv(micros + 999, 1000)
  if ms < MIN_TTL_MS then
    ms = MIN_TTL_MS
  end
  if ms < 1 then
    ms = 1
  end
  return int(ms)
end

-- PEXPIRE in whole milliseconds, rounded up, at least 1.
local function expire(key, micros)
  redis.call('PEXPIRE', key, ttl_ms(micros))
end

-- The most slots (log entries, non-empty buckets) a denial's retry walk
-- looks at; past it the wait reported is reset_after. Equal to
-- MAX_RETRY_WALK in algorithm/timeline.rs, so both stores answer alike.
local MAX_RETRY_WALK = 128

local function begin()
  t = now_micros()
  c = ARGV[2] + 0
  MIN_TTL_MS = ARGV[3] + 0
end

-- Algorithms by code: {keys = how many KEYS a quota uses,
--   evaluate = function(q) (reads, may drop expired state, decides, records
--     nothing; sets q.fits, q.remaining, q.reset, q.retry and the state the
--     quota reports unchanged, q.remaining0 and q.reset0),
--   commit = function(q) (records c after every quota fit, sets TTLs),
--   settle = optional function(q) (writes back state evaluate dropped when
--     the request is denied, only if q.dirty)}.
-- q holds q.key (and q.key2 for a second key) and the parameters q.p1..q.p3.
local ALGORITHMS = {}

-- The cost fits: remaining/reset once committed, and as they stand now.
local function fits(q, remaining, reset, remaining0, reset0)
  q.fits = true
  q.remaining, q.reset, q.retry = remaining, reset, 0
  q.remaining0, q.reset0 = remaining0, reset0
end

-- The cost does not fit; retry = -1 when it never can.
local function denied(q, remaining, reset, retry)
  q.fits = false
  q.remaining, q.reset, q.retry = remaining, reset, retry
  q.remaining0, q.reset0 = remaining, reset
end

-- An algorithm code argument: the code, and whether SHADOW_FLAG (16) is
-- added to it (a shadow quota, which never denies).
local SHADOW_FLAG = 16
local function quota_code(arg)
  local code = tonumber(arg) or 0
  if code >= SHADOW_FLAG then
    return code - SHADOW_FLAG, true
  end
  return code, false
end

-- The policy's quotas, from the slots ARGV[5..4 + 4n] (n = ARGV[4]) and
-- KEYS, in policy order: each q holds code, shadow, algorithm, key, key2
-- and p1..p3. With `costs_after` (how many arguments follow the slots
-- before the optional cost of each quota), q.c is quota i's cost,
-- ARGV[4 + 4n + costs_after + i], else c, and below `min_cost` refused.
-- `spare`: how many KEYS follow the quotas'. Answers nil and the error
-- reply for a layout that is not one.
--
-- The list and its tables are the library's, reused by every call (Redis
-- runs one script at a time): each call sets the fields above and dirty =
-- false, and the algorithms set every other field before they read it.
local QUOTAS = {}
local function read_quotas(costs_after, min_cost, spare)
  local count = ARGV[4] + 0
  local quotas = QUOTAS
  for i = #quotas, count + 1, -1 do
    quotas[i] = nil
  end
  local next_key = 1
  for i = 1, count do
    local base = 4 + (i - 1) * 4
    local code, shadow = quota_code(ARGV[base + 1])
    local algorithm = ALGORITHMS[code]
    if not algorithm then
      return nil, redis.error_reply('ERR tower-window: unknown algorithm code')
    end
    local q = quotas[i]
    if not q then
      -- Made whole by its constructor (an EVAL makes it on every call:
      -- filled one field at a time, it would grow four times).
      q = {code = 0, algorithm = false, shadow = false, dirty = false, key = false, key2 = false,
        p1 = 0, p2 = 0, p3 = 0, c = 0}
      quotas[i] = q
    end
    q.code, q.algorithm, q.shadow, q.dirty = code, algorithm, shadow, false
    q.key, q.key2 = KEYS[next_key], KEYS[next_key + 1]
    q.p1, q.p2, q.p3 = ARGV[base + 2] + 0, ARGV[base + 3] + 0, ARGV[base + 4] + 0
    q.c = c
    if costs_after then
      local cost = ARGV[4 + count * 4 + costs_after + i]
      if cost then
        q.c = tonumber(cost) or c
      end
      if q.c < min_cost then
        return nil, redis.error_reply('ERR tower-window: a cost below ' .. min_cost)
      end
    end
    next_key = next_key + algorithm.keys
  end
  if next_key - 1 + spare ~= #KEYS then
    return nil, redis.error_reply('ERR tower-window: keys do not match the quotas')
  end
  return quotas
end

-- A reply {0, t, then 4 zeros per quota of n}: made whole by one
-- constructor up to three quotas (a table filled one value at a time is
-- rebuilt each time it doubles).
local function new_reply(n)
  if n == 1 then
    return {0, t, 0, 0, 0, 0}
  elseif n == 2 then
    return {0, t, 0, 0, 0, 0, 0, 0, 0, 0}
  elseif n == 3 then
    return {0, t, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  end
  local reply = {0, t}
  for j = 3, 2 + 4 * n do
    reply[j] = 0
  end
  return reply
end

-- Each quota's state as it stands, for a check of its cost q.c that
-- records nothing (peek.lua, settle.lua), in policy.lua's reply: admitted
-- when the cost fits every enforced quota; per quota, remaining and reset
-- before the cost, retry 0 when it fits. State evaluate dropped because
-- it expired is written back as after a denial.
local function standing(quotas)
  local admitted = true
  local n = #quotas
  local reply = new_reply(n)
  for i = 1, n do
    local q = quotas[i]
    c = q.c
    q.dirty = false
    local algorithm = q.algorithm
    algorithm.evaluate(q)
    local fit = q.fits
    if not fit and not q.shadow then
      admitted = false
    end
    if q.dirty and algorithm.settle then
      algorithm.settle(q)
    end
    local j = 4 * i - 1
    reply[j], reply[j + 1], reply[j + 2] = fit and 1 or 0, q.remaining0, q.reset0
    reply[j + 3] = fit and 0 or q.retry
  end
  reply[1] = admitted and 1 or 0
  return reply
end

-- Decides one request against quotas, all-or-nothing (policy.lua's reply;
-- lease.lua decides a check with it when a reservation grants nothing). Each
-- q also holds its cost q.c. Every quota is evaluated (reads; expired state
-- may be dropped; nothing is recorded). Only if every enforced quota fits is
-- the cost committed, to every quota it fits (a shadow quota that would deny
-- records nothing).
local function decide(quotas)
  local admitted = true
  local n = #quotas
  for i = 1, n do
    local q = quotas[i]
    c = q.c
    q.algorithm.evaluate(q)
    if not q.fits and not q.shadow then
      admitted = false
    end
  end
  local reply = new_reply(n)
  reply[1] = admitted and 1 or 0
  for i = 1, n do
    local q = quotas[i]
    c = q.c
    local fit = q.fits
    if admitted and fit then
      q.algorithm.commit(q)
    elseif q.dirty and q.algorithm.settle then
      q.algorithm.settle(q)
    end
    local j = 4 * i - 1
    if admitted or not fit then
      reply[j], reply[j + 1], reply[j + 2], reply[j + 3] = fit and 1 or 0, q.remaining, q.reset, q.retry
    else
      reply[j], reply[j + 1], reply[j + 2], reply[j + 3] = 1, q.remaining0, q.reset0, 0
    end
  end
  return reply
end
