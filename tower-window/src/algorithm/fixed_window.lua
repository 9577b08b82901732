-- Fixed window (code 3). One key: HASH {k = window index floor(t / W), n =
-- units admitted in it}. Parameters: p1 = W (µs), p2 = L.
ALGORITHMS[3] = {
  keys = 1,
  evaluate = function(q)
    local W, L = q.p1, q.p2
    local k = idiv(t, W)
    local state = redis.call('HMGET', q.key, 'k', 'n')
    local count = 0
    if state[1] and tonumber(state[1]) == k then
      count = tonumber(state[2]) or 0
    end
    local reset = (k + 1) * W - t
    q.window, q.count = k, count
    if c > L then
      return denied(q, L - count, reset, -1)
    end
    if count + c <= L then
      return fits(q, L - count - c, reset, L - count, reset)
    end
    return denied(q, L - count, reset, reset)
  end,
  commit = function(q)
    redis.call('HSET', q.key, 'k', int(q.window), 'n', int(q.count + c))
    expire(q.key, q.reset)
  end,
}
