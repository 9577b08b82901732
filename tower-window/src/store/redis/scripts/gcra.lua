-- GCRA. KEYS[1] = STRING theoretical arrival time (µs); absent means "now".
-- ARGV[4] = T (emission interval, µs), ARGV[5] = B (burst).
local key = KEYS[1]
local T = tonumber(ARGV[4])
local B = tonumber(ARGV[5])
local BT = B * T

local tat = tonumber(redis.call('GET', key) or '')
if not tat or tat < t then
  tat = t
end
-- tat is now max(stored tat, t).

local function remaining_at(ahead)
  if ahead >= BT then
    return 0
  end
  return idiv(BT - ahead, T)
end

if c > B then
  return {0, remaining_at(tat - t), tat - t, -1, t}
end
local new_tat = tat + c * T
if new_tat - t <= BT then
  redis.call('SET', key, int(new_tat))
  expire(key, new_tat - t)
  return {1, remaining_at(new_tat - t), new_tat - t, 0, t}
end

-- Denied: record nothing.
return {0, remaining_at(tat - t), tat - t, new_tat - t - BT, t}
