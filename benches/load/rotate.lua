-- wrk script: like users.lua, but the users take turns instead of being
-- drawn at random. Thread t of T (WRK_THREADS, env, default 1) sends u<t>,
-- u<t+T>, u<t+2T>, … and wraps after WRK_USERS (env, default 10000), so
-- every user's state exists after the first lap and every key recurs at the
-- same rate (WRK_USERS=1: one hot user). Prints the same RESULT line as
-- users.lua.
local users = tonumber(os.getenv("WRK_USERS") or "10000")
local step = tonumber(os.getenv("WRK_THREADS") or "1")
local threads = {}
local next_id = 0

function setup(thread)
   next_id = next_id + 1
   thread:set("id", next_id)
   table.insert(threads, thread)
end

function init(args)
   s2xx, s429, other = 0, 0, 0
   turn = id - 1
end

function request()
   local user = turn % users + 1
   turn = turn + step
   return wrk.format("GET", nil, { ["x-user-id"] = "u" .. user })
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
