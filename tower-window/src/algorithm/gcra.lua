-- GCRA (code 4). One key: STRING theoretical arrival time (µs); absent
-- means "now". Parameters: p1 = T (emission interval, µs), p2 = B (burst).
local function gcra_remaining(ahead, T, BT)
  if ahead >= BT then
    return 0
  end
  return idiv(BT - ahead, T)
end

ALGORITHMS[4] = {
  keys = 1,
  evaluate = function(q)
    local T, B = q.p1, q.p2
    local BT = B * T
    local tat = tonumber(redis.call('GET', q.key) or '')
    if not tat or tat < t then
      tat = t
    end
    -- tat is now max(stored tat, t).
    local before = gcra_remaining(tat - t, T, BT)
    if c > B then
      return denied(q, before, tat - t, -1)
    end
    local new_tat = tat + c * T
    if new_tat - t <= BT then
      q.tat = new_tat
      return fits(q, gcra_remaining(new_tat - t, T, BT), new_tat - t, before, tat - t)
    end
    return denied(q, before, tat - t, new_tat - t - BT)
  end,
  commit = function(q)
    -- SET ... PX: the value and its TTL in one command (as SET, PEXPIRE).
    redis.call('SET', q.key, int(q.tat), 'PX', ttl_ms(q.tat - t))
  end,
}
