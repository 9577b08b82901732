-- tower-window tenant registry: the whole runtime state, read atomically
-- with the control stream's last id (so a reader that loads, then reads the
-- stream after that id, misses nothing and sees nothing twice).
--
-- KEYS as lifecycle.lua. ARGV[1] = TTL in ms, refreshed on existing keys
-- (a running node keeps the records alive).
--
-- Reply: {last id ("0-0" for none), first id ("0-0" for none),
-- records as a flat HGETALL, generations as a flat HGETALL, entries ever
-- added to the stream (XINFO's entries-added, Redis 7; -1 before)}.

local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
local first = redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', 1)
local last_id, first_id = '0-0', '0-0'
if #last > 0 then
  last_id = last[1][1]
end
if #first > 0 then
  first_id = first[1][1]
end
for i = 1, 3 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
  end
end
local added = -1
if redis.call('EXISTS', KEYS[3]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[3])
  for i = 1, #info, 2 do
    if info[i] == 'entries-added' then
      added = info[i + 1]
    end
  end
else
  added = 0
end
return {last_id, first_id, redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]), added}
