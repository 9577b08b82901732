-- tower-window: decide one request against a whole policy, all-or-nothing.
--
-- KEYS: each quota's keys in policy order; how many per quota depends on its
-- algorithm (sliding log 2: log and companion; the others 1).
--
-- ARGV[1] = now in microseconds since the epoch, or "" to read Redis TIME
-- ARGV[2] = cost c (>= 1), every quota's unless it has its own (below)
-- ARGV[3] = lowest TTL in ms (0 in production; padded when the caller's clock is used)
-- ARGV[4] = number of quotas
-- then 4 slots per quota i = 0, 1, ...: ARGV[5 + 4i] = algorithm code
-- (plus SHADOW_FLAG, 16, for a shadow quota: it never denies),
-- ARGV[6 + 4i .. 8 + 4i] = its parameters p1, p2, p3 (0 when unused):
--   1 sliding log      W (µs), L, 0
--   2 sliding counter  W (µs), L, G (bucket width, µs)
--   3 fixed window     W (µs), L, 0
--   4 GCRA             T (emission interval, µs), B (burst), 0
-- then, optionally, one cost per quota in policy order: ARGV[5 + 4n + i]
-- for quota i = 0, 1, ... of n (a request whose descriptors weigh
-- differently, decided together all the same).
--
-- Every quota is evaluated (reads; expired state may be dropped; nothing is
-- recorded). Only if every enforced quota fits is the cost committed, to
-- every quota it fits (a shadow quota that would deny records nothing): see
-- decide() in the prelude.
--
-- Reply: {allowed (0/1), now_us, then per quota in policy order: allowed
-- (0/1), remaining, reset_after_us, retry_after_us (-1 = never)}. A quota
-- that fits while another denies reports allowed = 1 and its state as it
-- stands (remaining before the cost, reset before), retry_after 0. A shadow
-- quota that does not fit reports allowed = 0 (its would-be denial) even
-- when the request is admitted.
-- remaining may be negative after a limit was lowered; the caller clamps.

begin()
local quotas, invalid = read_quotas(0, 1, 0)
if not quotas then
  return invalid
end
return decide(quotas)
