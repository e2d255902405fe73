--[[
claim: hand out up to a batch of due records of one shard under a lease.

Records whose lease has expired (claimed, never acknowledged) come first and are counted as
redeliveries. The rest of the batch goes to records whose due time has come, priority lane by
priority lane (high, normal, low: see LANES in _lib.lua), down to lane ARGV[7]: a lane's due
records all leave before the next lane's first. Within a lane, an overdue backlog (after an
outage) cannot hold up records falling due now:

* on time: due within the last ARGV[4] ms — up to half of the room (rounded down), earliest first;
* overdue: due before that — the rest of the room, earliest first;
* on time again, if the overdue records left room.

With no backlog every record is on time and the order is (priority, due, offset), as it is within
each part. Each part is read by score within its lane and removed as the run of ranks its first
member starts (remove_run), so exactly the records handed out leave the index. Each record handed
out is kept under its offset in the claimed HASH with a lease in the in-flight ZSET. "Now" is
Redis TIME unless a test passes it.

Ahead (ARGV[6] > 0, and no horizon): room left after the due records goes to records due within
the next ARGV[6] ms that carry the default delay-id — no cancel or replacement can reach those
(only caller-given ids are indexed), so leasing them before they are due changes nothing but
when Redis is asked; the mover produces each from memory at its due time, never earlier. A
record with its own delay-id stays until it is due, so a late cancel still finds it.

Acknowledgements of the shard's records the mover has collected come along (ARGV[10..]) and are
applied first, as ack.lua would: one call per shard, not two.

From a wait index (ARGV[9] names its target: egress.max_rate_per_target), KEYS[1] is that index:
the due records it holds are claimed as above, up to the target's allowance; expired leases are
left to the shard's claims from its due index, and a wait index claimed empty leaves the waits SET.

KEYS[1]  due index      ZSET  member (offset + encoded record) -> score (due ms in its lane), or
                              the wait index of ARGV[9]
KEYS[2]  in-flight      ZSET  offset -> lease deadline ms
KEYS[3]  claimed        HASH  offset -> member
KEYS[4]  low index      ZSET  offset bucket -> 0
KEYS[5]  pending        HASH  offset bucket -> bitmap of its pending offsets
KEYS[6]  id index       HASH  delay-id -> offset (8 bytes) .. due ms
KEYS[7]  meta           HASH  "epoch" -> the state's epoch (see ack() in _lib.lua), "topic_id"
KEYS[8]  waits          SET   targets with a wait index
KEYS[9]  targets        HASH  target -> records held whole (see _lib.lua): the
                              acknowledgements' records leave it
ARGV[1]  batch limit (records)
ARGV[2]  lease length ms
ARGV[3]  now ms, or "" to read Redis TIME
ARGV[4]  the on-time window ms
ARGV[5]  a horizon ms, or "": records due after it stay, however late (the ingress is still
         catching up on the shard's partition: see bridge.catchup)
ARGV[6]  ahead ms: also lease default-id records due by now + this (0: none)
ARGV[7]  the last lane to claim from (1 high, 2 normal, 3 low; "" for all): the mover holds
         lower lanes back while another shard it owns has records of a higher one due
ARGV[8]  the last lane to claim ahead from ("" for all): the mover claims a lane ahead only while
         no shard it owns has records of a higher lane due within the window
ARGV[9]  the target whose wait index KEYS[1] is, or "" for the due index
ARGV[10] the ingest watermark the caller's ingress last saw, or "": a shard whose watermark is
         below it (or gone) lost writes Redis had taken — a rollback: an AOF tail, a failover — and
         until the ingress has read them again (a cancel among them), nothing new is claimed from
         it; expired leases still are, and its next work is said to be a moment away
ARGV[11] a ceiling ms on now, or "": the caller's other clocks (bridge.egress.plan.DecisionClock);
         the claim decides by the lesser of it and Redis TIME, so a step forward of Redis's host
         clock makes nothing early and ends no lease
ARGV[12] the most records claimed ahead, or "": as many as the room leaves (the mover's cap
         keeps a claim ahead from growing with the rate: bridge.egress.plan.ahead_limit)
ARGV[13..] acknowledgements, as ack.lua's ARGV: epoch, n, n offsets, how many have a delay-id,
         their targets

Returns: {now ms, redelivered count, earliest due ms left or -1, earliest lease deadline ms or -1,
          Redis TIME at the end (now ms when given; never capped: the caller compares its
          clocks by it), the shard's epoch (its acknowledgements name
          it), the lanes with records due left (bit 1 high, 2 normal, 4 low), the earliest due
          ms left in each lane (high, normal, low; -1: none), the topic id of the incarnation
          the records belong to ("": not known; the journal entries of their fates name it),
          member, member, ...} — the two
          times tell
          the mover when the shard next has work, so it needs no other call to plan its sleep; the
          clock at the end lets it carry Redis's clock on from its reply (a claim of many records
          runs for ms).
]]
local target = ARGV[9]
local now = now_ms(ARGV[3])
if ARGV[11] ~= '' then
  now = math.min(now, tonumber(ARGV[11]))
end
ack({KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[9]}, ARGV, 13, now)
local limit = tonumber(ARGV[1])
-- The lease deadline as text once: a number passed to redis.call is formatted per argument.
local deadline = string.format('%d', now + tonumber(ARGV[2]))
local state = redis.call('HMGET', KEYS[7], 'epoch', 'topic_id')
local out = {now, 0, -1, -1, now, state[1] or '', 0, -1, -1, -1, state[2] or ''}
local HEAD = #out
local leases = {}

-- Expired leases: lease them again (a lease whose record is gone is dropped).
local expired = {}
if target == '' then
  expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
end
if #expired > 0 then
  local _, members = call_chunked('HMGET', KEYS[3], expired)
  local gone = {}
  for i, offset in ipairs(expired) do
    if members[i] then
      leases[#leases + 1] = deadline
      leases[#leases + 1] = offset
      out[#out + 1] = members[i]
    else
      gone[#gone + 1] = offset
    end
  end
  call_chunked('ZREM', KEYS[2], gone)
end
out[2] = #out - HEAD

local room = limit - out[2]
local rolled_back = false
if ARGV[10] ~= '' then
  local mark = redis.call('HGET', KEYS[7], 'ingested')
  rolled_back = not mark or tonumber(mark) < tonumber(ARGV[10])
end
if rolled_back then
  room = 0
end
local upto = now
if ARGV[5] and ARGV[5] ~= '' then
  upto = math.min(now, tonumber(ARGV[5]))
end
local last_lane = #LANES
if ARGV[7] ~= '' then
  last_lane = tonumber(ARGV[7])
end
local window = tonumber(ARGV[4])
local claimed = {}
for lane, base in ipairs(LANES) do
  local due = redis.call('ZCOUNT', KEYS[1], int(base), int(base + upto))
  if due > 0 and room > 0 and lane <= last_lane then
    local edge = int(base + upto - window)
    local overdue = redis.call('ZCOUNT', KEYS[1], int(base), edge)
    local on_time = due - overdue
    local take_on_time = math.min(math.floor(room / 2), on_time)
    local take_overdue = math.min(room - take_on_time, overdue)
    take_on_time = math.min(room - take_overdue, on_time)
    -- Each part is read by score within the lane and leaves as the run of ranks it is: what is
    -- removed is exactly what is handed out, whatever else the index holds (each run's first
    -- rank is read as it leaves).
    local overdue_run, on_time_run = {}, {}
    if take_overdue > 0 then
      overdue_run = redis.call('ZRANGEBYSCORE', KEYS[1], int(base), edge, 'LIMIT', 0, take_overdue)
    end
    if take_on_time > 0 then
      on_time_run = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. edge, int(base + upto),
        'LIMIT', 0, take_on_time)
    end
    remove_run(KEYS[1], on_time_run)
    remove_run(KEYS[1], overdue_run)
    for _, run in ipairs({overdue_run, on_time_run}) do
      for _, member in ipairs(run) do
        claimed[#claimed + 1] = member
      end
    end
    room = room - #overdue_run - #on_time_run
    due = due - #overdue_run - #on_time_run
  end
  if due > 0 then
    out[7] = bit.bor(out[7], bit.lshift(1, lane - 1))
  end
end
local ahead = tonumber(ARGV[6])
if room > 0 and ahead > 0 and upto == now and out[7] == 0 then
  -- A stored record is its offset (8 bytes), the encoding's version (2) and its flags, of which
  -- 2 is DEFAULT_ID (bridge.message.encode). Every record due by now has left (there was room
  -- for all); of those due next, the default-id ones leave (by member among others).
  local last_ahead = #LANES
  if ARGV[8] ~= '' then
    last_ahead = tonumber(ARGV[8])
  end
  if ARGV[12] ~= '' then
    room = math.min(room, tonumber(ARGV[12]))
  end
  for lane, base in ipairs(LANES) do
    if room <= 0 or lane > last_ahead then
      break
    end
    local later = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. int(base + now),
      int(base + now + ahead), 'LIMIT', 0, room)
    local taken = {}
    for _, member in ipairs(later) do
      if string.byte(member, 9) == 2 and bit.band(string.byte(member, 10), 2) ~= 0 then
        taken[#taken + 1] = member
        claimed[#claimed + 1] = member
      end
    end
    room = room - #taken
    if #taken == #later then  -- all default ids, as most are: one run of ranks
      remove_run(KEYS[1], taken)
    else
      call_chunked('ZREM', KEYS[1], taken)
    end
  end
end
if #claimed > 0 then
  local held, n, m, o = {}, #leases, 0, #out
  for _, member in ipairs(claimed) do
    local offset = string.sub(member, 1, 8)
    leases[n + 1], leases[n + 2], n = deadline, offset, n + 2
    held[m + 1], held[m + 2], m = offset, member, m + 2
    out[o + 1], o = member, o + 1
  end
  call_chunked('HSET', KEYS[3], held)
end
call_chunked('ZADD', KEYS[2], leases)
-- The earliest due time left: of each lane's first record (rolled back: a moment from now).
for lane, base in ipairs(rolled_back and {} or LANES) do
  local first = redis.call('ZRANGEBYSCORE', KEYS[1], int(base), '(' .. int(base + LANE),
    'WITHSCORES', 'LIMIT', 0, 1)
  if first[2] then
    local due = tonumber(first[2]) - base
    out[7 + lane] = due
    if out[3] < 0 or due < out[3] then
      out[3] = due
    end
  end
end
if rolled_back then
  out[3] = now + 250
end
if target ~= '' and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[8], target)
end
local lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
out[4] = tonumber(lease[2] or '-1')
if ARGV[3] == '' then
  out[5] = now_ms('')
end
return out
