-- tower-window tenant registry: one lifecycle change, recorded and announced.
--
-- KEYS[1] = records HASH (tenant -> record: "A\n<spec>" active, "C" closed)
-- KEYS[2] = generations HASH (tenant -> state generation)
-- KEYS[3] = control STREAM
-- (all three share the hash tag {tw-tenants}: one slot)
-- ARGV[1] = op: init | reset | close | revert (drops the record: the file decides again)
-- ARGV[2] = tenant
-- ARGV[3] = the spec record for init ("" otherwise)
-- ARGV[4] = approximate stream length kept (XADD MAXLEN ~)
-- ARGV[5] = TTL of the three keys in ms (refreshed by every change and load)
--
-- Reply: {stream id, generation}. reset and close move the tenant to a new
-- generation (its windows' keys change everywhere); init and revert keep it.

local op, tenant = ARGV[1], ARGV[2]
local generation = tonumber(redis.call('HGET', KEYS[2], tenant) or '0')
if op == 'reset' or op == 'close' then
  generation = redis.call('HINCRBY', KEYS[2], tenant, 1)
elseif op ~= 'init' and op ~= 'revert' then
  return redis.error_reply('ERR tower-window: unknown tenant op')
end
if op == 'init' then
  redis.call('HSET', KEYS[1], tenant, 'A\n' .. ARGV[3])
elseif op == 'close' then
  redis.call('HSET', KEYS[1], tenant, 'C')
elseif op == 'revert' then
  redis.call('HDEL', KEYS[1], tenant)
end
local id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*',
  'op', op, 'tenant', tenant, 'gen', string.format('%d', generation), 'spec', ARGV[3])
for i = 1, 3 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[5])
  end
end
return {id, string.format('%d', generation)}
