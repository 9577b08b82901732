-- tower-window: shared prelude, prepended to every algorithm script.
--
-- ARGV[1] = now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2] = cost (>= 1)
-- ARGV[3] = lowest TTL in ms (0 in production; padded when the caller's clock is used)
-- ARGV[4..] = the algorithm's parameters
--
-- Time is integer microseconds throughout. Lua 5.1 numbers are doubles, exact
-- for integers below 2^53 (~285 years of microseconds since 1970), so every
-- value is kept an integer: divisions go through idiv, and numbers are sent
-- to Redis as "%d" strings (tostring would print 1.7e+15).
--
-- Returns {allowed (0/1), remaining, reset_after_us, retry_after_us (-1 = never), now_us}.

-- Redis 3.2-4.x need effects replication to write after TIME; a no-op from 5 on.
if redis.replicate_commands then
  redis.replicate_commands()
end

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

local function now_micros()
  if ARGV[1] ~= '' then
    return tonumber(ARGV[1])
  end
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000000 + tonumber(time[2])
end

local MIN_TTL_MS = tonumber(ARGV[3])

-- PEXPIRE in whole milliseconds, rounded up, at least 1.
local function expire(key, micros)
  local ms = idiv(micros + 999, 1000)
  if ms < MIN_TTL_MS then
    ms = MIN_TTL_MS
  end
  if ms < 1 then
    ms = 1
  end
  redis.call('PEXPIRE', key, int(ms))
end

local t = now_micros()
local c = tonumber(ARGV[2])
