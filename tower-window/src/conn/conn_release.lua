-- Releases one seat from its sets.
-- KEYS[1]  the subject's seat set; KEYS[2] (tenant form) the tenant's
-- ARGV[1]  the seat id
-- Reply: 1 if the seat was in the subject's set.
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if KEYS[2] then
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return removed
