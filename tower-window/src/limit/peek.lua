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

begin()
local quotas, invalid = read_quotas(0, 1, 0)
if not quotas then
  return invalid
end
return standing(quotas)
