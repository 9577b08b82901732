-- Appends one batch of audit records to a tenant's stream, at most once.
-- KEYS[1]  the tenant's stream
-- KEYS[2]  the writing node's mark: the number of its last batch applied
-- ARGV[1]  the batch's number
-- ARGV[2]  entries kept (about: MAXLEN ~)
-- ARGV[3]  age kept (ms): older entries are trimmed (MINID ~, on Redis's
--          clock), and the stream and the mark expire after it
-- ARGV[4..] the records, each the text of its entry's one field, `r`
-- Returns the number of records added: 0 when the batch was applied before.
local seq = ARGV[1] + 0
local last = redis.call('GET', KEYS[2])
if last and tonumber(last) >= seq then
  return 0
end
local max_len, max_age = ARGV[2], ARGV[3] + 0
for i = 4, #ARGV do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', max_len, '*', 'r', ARGV[i])
end
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('XTRIM', KEYS[1], 'MINID', '~', string.format('%d', now_ms - max_age))
redis.call('PEXPIRE', KEYS[1], max_age)
redis.call('SET', KEYS[2], seq, 'PX', max_age)
return #ARGV - 3
