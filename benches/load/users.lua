-- wrk script for benches/load/run.sh.
-- Every request carries `x-user-id: u<N>`, N uniform in [1, WRK_USERS]
-- (env, default 10000; 1 = one user). Counts responses by status and prints
-- one machine-readable line at the end:
--   RESULT rps=<req/s> p50_us=<µs> p99_us=<µs> s2xx=<n> s429=<n> other=<n> errors=<n>
local users = tonumber(os.getenv("WRK_USERS") or "10000")
local threads = {}
local next_id = 0

function setup(thread)
   next_id = next_id + 1
   thread:set("id", next_id)
   table.insert(threads, thread)
end

function init(args)
   math.randomseed(os.time() * 1000 + id)
   s2xx, s429, other = 0, 0, 0
end

function request()
   -- nil: the path of the URL wrk was given (/ or the gateway's /api/hello).
   return wrk.format("GET", nil, { ["x-user-id"] = "u" .. math.random(users) })
end

function response(status, headers, body)
   if status >= 200 and status < 300 then
      s2xx = s2xx + 1
   elseif status == 429 then
      s429 = s429 + 1
   else
      other = other + 1
   end
end

function done(summary, latency, requests)
   local ok, limited, rest = 0, 0, 0
   for _, t in ipairs(threads) do
      ok = ok + t:get("s2xx")
      limited = limited + t:get("s429")
      rest = rest + t:get("other")
   end
   local e = summary.errors
   io.write(string.format(
      "RESULT rps=%.0f p50_us=%d p99_us=%d s2xx=%d s429=%d other=%d errors=%d\n",
      summary.requests / (summary.duration / 1e6),
      latency:percentile(50), latency:percentile(99),
      ok, limited, rest, e.connect + e.read + e.write + e.timeout))
end
