-- tower-window: settle a request's usage against a whole policy, after the
-- prelude, the algorithm fragments and take_back.lua; algorithm/settle.rs
-- is the Rust twin and says why each step is exact.
--
-- KEYS and ARGV[1..4 + 4n] as policy.lua, with ARGV[2] = the units used
-- (every quota's unless it has its own, below); then
--   ARGV[5 + 4n] = the units the reservation recorded (0: none),
--   ARGV[6 + 4n] = the store's clock (µs) when it did,
--   ARGV[7 + 4n] = one character per quota in policy order: '1' where the
--     reservation recorded its units, '0' where it recorded nothing (a
--     shadow quota it did not fit),
--   optionally one usage per quota in policy order: ARGV[7 + 4n + i].
--
-- Per quota: usage below the reservation gives the rest back where the
-- reservation put it, while it still counts; usage above it records the
-- excess now, past the limit if need be (debt). Shadow quotas alike.
--
-- Reply: policy.lua's, for a check of one unit that records nothing: each
-- quota's state as it stands once settled, allowed when one more unit fits.

begin()
local count = tonumber(ARGV[4]) or 0
local extra = 5 + 4 * count
local units = tonumber(ARGV[extra]) or 0
local reserved_at = tonumber(ARGV[extra + 1]) or 0
local recorded = ARGV[extra + 2] or ''
-- q.c: the units quota i used.
local quotas, invalid = read_quotas(3, 0, 0)
if not quotas then
  return invalid
end
for i = 1, count do
  local q = quotas[i]
  q.reserved = 0
  if string.sub(recorded, i, i) == '1' then
    q.reserved = units
  end
  if q.c < q.reserved and q.code == 4 then
    return redis.error_reply('ERR tower-window: gcra cannot give back part of a reservation')
  end
end

-- Sets what commit writes as if the cost had fit (evaluate sets it only
-- then): the newest entry or bucket, the TTL, GCRA's arrival time.
local function as_if_fit(q)
  if q.code == 1 then
    q.newest_after = math.max(t, q.newest or t)
    q.reset = q.newest_after + q.p1 - t
  elseif q.code == 2 then
    q.reset = (math.max(q.b, q.hi or q.b) + idiv(q.p1, q.p3) + 1) * q.p3 - t
  elseif q.code == 4 then
    q.tat = t + q.reset0 + c * q.p1
  end
end

for i = 1, count do
  local q = quotas[i]
  local used, reserved = q.c, q.reserved
  if used < reserved then
    local anchor = reserved_at
    if q.code == 3 then
      anchor = idiv(reserved_at, q.p1)
    elseif q.code == 2 then
      anchor = idiv(reserved_at, q.p3)
    end
    take_back(q, anchor, 0, reserved, reserved - used)
  elseif used > reserved then
    c = used - reserved
    q.algorithm.evaluate(q)
    as_if_fit(q)
    q.algorithm.commit(q)
  end
  q.c = 1
end
return standing(quotas)
