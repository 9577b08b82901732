-- tower-window: read a whole policy's windows without consuming anything
-- (the usage an admin sees). Follows the prelude and the algorithm fragments
-- in place of policy.lua, with the same KEYS and ARGV (ARGV[2], the cost, is
-- the cost asked about, usually 1, and the optional cost per quota after
-- the quota slots).
--
-- Every quota is evaluated; nothing is committed. State that evaluate
-- dropped because it expired is written back as settle would after a
-- denial (it no longer counts either way), so a peek changes no decision
-- while the clock moves forward; MemoryStore's peek drops it alike, so the
-- stores still agree if the clock later steps back before that expiry.
--
-- Reply: {admitted (0/1, whether the cost would fit every enforced quota),
-- now_us, then per quota in policy order: fits (0/1), remaining as it
-- stands, reset_after_us as it stands, retry_after_us (0 when it fits,
-- -1 = never)}.

local count = tonumber(ARGV[4])
local quotas = {}
local next_key = 1
for i = 1, count do
  local base = 4 + (i - 1) * 4
  local code, shadow = quota_code(ARGV[base + 1])
  local algorithm = ALGORITHMS[code]
  if not algorithm then
    return redis.error_reply('ERR tower-window: unknown algorithm code')
  end
  quotas[i] = {
    algorithm = algorithm,
    shadow = shadow,
    key = KEYS[next_key],
    key2 = KEYS[next_key + 1],
    p1 = tonumber(ARGV[base + 2]),
    p2 = tonumber(ARGV[base + 3]),
    p3 = tonumber(ARGV[base + 4]),
    -- This quota's cost: its own after the slots, else the request's.
    c = tonumber(ARGV[4 + count * 4 + i]) or c,
  }
  if quotas[i].c < 1 then
    return redis.error_reply('ERR tower-window: a cost below 1')
  end
  next_key = next_key + algorithm.keys
end
if next_key - 1 ~= #KEYS then
  return redis.error_reply('ERR tower-window: keys do not match the quotas')
end

local admitted = true
local reply = {0, t}
for i = 1, count do
  local q = quotas[i]
  c = q.c
  q.algorithm.evaluate(q)
  if not q.fits and not q.shadow then
    admitted = false
  end
  if q.dirty and q.algorithm.settle then
    q.algorithm.settle(q)
  end
  reply[#reply + 1] = q.fits and 1 or 0
  reply[#reply + 1] = q.remaining0
  reply[#reply + 1] = q.reset0
  reply[#reply + 1] = q.fits and 0 or q.retry
end
reply[1] = admitted and 1 or 0
return reply
