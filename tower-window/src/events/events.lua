-- One operation on one event window (see events.rs and crate::events).
--
-- KEYS[1] the stream; KEYS[2] its meta hash, in the same slot:
--   e = epoch, r = replication id of the primary the epoch was made on,
--   l = last id generated in this epoch, n = events appended so far.
-- Every stream entry starts with three fields of ours: p = the id generated
-- before it (so a gap before the first kept event is seen exactly),
-- n = its number and e = the epoch it was appended in (for live readers
-- of XREAD); the caller's fields follow.
--
-- ARGV[1] op: 'b' (batch) append, 'h' head, 'r' read, 'l' len
-- ARGV[2] now in ms, or '' for Redis TIME
-- ARGV[3] window ms, ARGV[4] max_len, ARGV[5] ttl ms, ARGV[6] nonce (hex)
-- append: ARGV[7] k (1 to 64 events; one event is a batch of one), then
--   per event its number of field, value arguments c (2 to 64) and those
--   c arguments                            -> {epoch, id 1, ..., id k}
--   appends the k events in order, each one's `p` the id before it, with
--   one trim, and SPUBLISHes the last id on the window's wake-up channel
--   (the stream's name with its last letter 'w', so the same hash tag and
--   slot): published by the append itself, so no append goes without its
--   wake-up. A wake-up only says "read this window from your last id"
--   (so one delivers the whole batch); the stream stays the only source
--   of events (see events/wake.rs).
-- head:                                    -> {epoch, last id}
-- read: ARGV[7] epoch, ARGV[8] after id, ARGV[9] limit (1 to 10000)
--   -> {0, entries...} | {1} too old | {2} epoch changed | {3} ahead
-- len:                                     -> XLEN
--
-- Nothing a reader sends changes the window: a read writes only what any
-- operation would (a new epoch when the keys vanished or another primary
-- holds them), whatever its position.
--
-- Work per call is bounded by the call, never by the history or by the
-- distance between two ids or times:
-- * XRANGE reads at most `limit` (<= 10000) entries;
-- * XADD's MINID ~ and XTRIM MAXLEN ~ drop whole stream nodes, at most
--   Redis's default LIMIT per call (100 * stream-node-max-entries: 10000
--   entries, measured on Redis 7.0), so a window whose retention shrank,
--   or whose clock jumped, is trimmed over several appends; the read's own
--   checks never return what the retention no longer keeps meanwhile;
-- * a stream dropped with its meta is UNLINKed (freed off the main thread);
-- * unpack() spreads at most 13 + 2 * 32 values (the stores refuse more
--   fields before calling);
-- * a batch appends at most 64 events (refused here past that, and by
--   the stores before calling), with one XTRIM and one SPUBLISH.
local stream, meta = KEYS[1], KEYS[2]
local op = ARGV[1]
if op == 'l' then
  return redis.call('XLEN', stream)
end

local t = redis.call('TIME')
local now
if ARGV[2] == '' then
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end
local window, max_len, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local function num(x)
  return string.format('%.0f', x)
end

local function split(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return tonumber(ms), tonumber(seq)
end

-- a == b, for stream ids
local function same(a, b)
  local am, as = split(a)
  local bm, bs = split(b)
  return am == bm and as == bs
end

-- a > b, for stream ids
local function later(a, b)
  local am, as = split(a)
  local bm, bs = split(b)
  if am ~= bm then
    return am > bm
  end
  return as > bs
end

local function touch()
  redis.call('PEXPIRE', stream, ttl)
  redis.call('PEXPIRE', meta, ttl)
end

local function rotate(rid)
  local epoch = string.format('%x%05x', tonumber(t[1]), tonumber(t[2])) .. ARGV[6]
  redis.call('HSET', meta, 'e', epoch, 'r', rid)
  return epoch
end

-- The current epoch, last id and count. A new epoch, with a new empty
-- stream, when either key vanished (expiry, DEL, flush: the history left
-- cannot be trusted); a new epoch over the same stream when another
-- primary holds it now (failover, restart).
local function current()
  local m = redis.call('HMGET', meta, 'e', 'r', 'l', 'n')
  local rid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)') or ''
  local exists = redis.call('EXISTS', stream) == 1
  if m[1] and exists and m[2] == rid then
    return m[1], m[3] or '0-0', tonumber(m[4] or '0')
  end
  if not (m[1] and exists) then
    redis.call('UNLINK', stream)
    redis.call('XGROUP', 'CREATE', stream, 'tw-init', '$', 'MKSTREAM')
    redis.call('XGROUP', 'DESTROY', stream, 'tw-init')
    redis.call('HSET', meta, 'l', '0-0', 'n', 0)
    local epoch = rotate(rid)
    touch()
    return epoch, '0-0', 0
  end
  return rotate(rid), m[3] or '0-0', tonumber(m[4] or '0')
end

local epoch, last, n = current()

if op == 'h' then
  touch()
  return {epoch, last}
end

-- The stream id for the next append: on an explicit clock, never below
-- the last id's ms, so ids still grow when the clock steps back.
local function next_id(prev)
  if ARGV[2] == '' then
    return '*'
  end
  local lm = split(prev)
  if now > lm then
    return num(now) .. '-*'
  end
  return num(lm) .. '-*'
end

-- XADDs one event after `prev` with the caller's fields ARGV[from..to];
-- the first of a call also trims by time (MINID ~).
local function add(prev, count, from, to, trim)
  local args = {'XADD', stream}
  local horizon = now - window
  if trim and horizon > 0 then
    table.insert(args, 'MINID')
    table.insert(args, '~')
    table.insert(args, num(horizon))
  end
  table.insert(args, next_id(prev))
  table.insert(args, 'p')
  table.insert(args, prev)
  table.insert(args, 'n')
  table.insert(args, count)
  table.insert(args, 'e')
  table.insert(args, epoch)
  for i = from, to do
    table.insert(args, ARGV[i])
  end
  return redis.call(unpack(args))
end

-- After the appends: the count cap, the meta, the TTLs and the wake-up.
local function appended(new, count)
  redis.call('XTRIM', stream, 'MAXLEN', '~', max_len)
  redis.call('HSET', meta, 'l', new, 'n', count)
  touch()
  -- pcall: on a Redis before 7 (no SPUBLISH) appends still work; its
  -- readers must poll (RoomHubBuilder::polling).
  redis.pcall('SPUBLISH', string.sub(stream, 1, -2) .. 'w', new)
end

if op == 'b' then
  -- Checked whole before the first XADD, so a bad batch appends nothing.
  local k = tonumber(ARGV[7])
  if not k or k < 1 or k > 64 then
    return redis.error_reply('a batch has 1 to 64 events')
  end
  local at = 8
  for _ = 1, k do
    local c = tonumber(ARGV[at])
    if not c or c < 2 or c > 64 or c % 2 ~= 0 or at + c > #ARGV then
      return redis.error_reply('bad batch layout')
    end
    at = at + 1 + c
  end
  if at ~= #ARGV + 1 then
    return redis.error_reply('bad batch layout')
  end
  local reply = {epoch}
  local prev = last
  at = 8
  for i = 1, k do
    local c = tonumber(ARGV[at])
    prev = add(prev, n + i, at + 1, at + c, i == 1)
    reply[i + 1] = prev
    at = at + 1 + c
  end
  appended(prev, n + k)
  return reply
end

if op == 'r' then
  if epoch ~= ARGV[7] then
    return {2}
  end
  local after = ARGV[8]
  if later(after, last) then
    -- The reader claims events this window does not have (lost in a
    -- restore or rollback that kept the epoch, or never there). Told so
    -- alone: a position a client sends never changes the window.
    return {3}
  end
  local limit = math.min(math.max(tonumber(ARGV[9]) or 1, 1), 10000)
  local entries = redis.call('XRANGE', stream, '(' .. after, '+', 'COUNT', limit)
  local first = entries[1]
  if not first then
    if later(last, after) then
      return {1}
    end
    return {0}
  end
  -- Recovered only if the first kept event after the position is the one
  -- that followed it (a gap made by trimming, or history lost with the
  -- position's own event, shows as another `p`), it is inside the window,
  -- and among the newest max_len.
  local fields = first[2]
  local fm = split(first[1])
  if not same(fields[2], after) or fm < now - window or n - tonumber(fields[4]) >= max_len then
    return {1}
  end
  -- And every event of the page followed the one before it (no entry
  -- deleted in between).
  for i = 2, #entries do
    if not same(entries[i][2][2], entries[i - 1][1]) then
      return {1}
    end
  end
  return {0, entries}
end

return redis.error_reply('unknown event op')
