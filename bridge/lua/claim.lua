--[[
claim: hand out up to a batch of due records of one shard under a lease.

Records whose lease has expired (claimed, never acknowledged) come first and are counted as
redeliveries. The rest of the batch goes to records whose due time has come, in two lanes so that
an overdue backlog (after an outage) cannot hold up records falling due now:

* on time: due within the last ARGV[4] ms — up to half of the room (rounded down), earliest first;
* overdue: due before that — the rest of the room, earliest first;
* on time again, if the overdue lane left room.

With no backlog every record is in the on-time lane and the order is (due, offset), as it is within
each lane. Each record handed out moves into the in-flight set with the lease deadline. "Now" is
Redis TIME unless a test passes it.

KEYS[1]  due index      ZSET  member -> due ms
KEYS[2]  in-flight      ZSET  member -> lease deadline ms
KEYS[3]  records        HASH  member -> encoded record
ARGV[1]  batch limit (records)
ARGV[2]  lease length ms
ARGV[3]  now ms, or "" to read Redis TIME
ARGV[4]  the on-time window ms

Returns: {now ms, redelivered count, member, record, member, record, ...}
]]
local now = now_ms(ARGV[3])
local limit = tonumber(ARGV[1])
local deadline = now + tonumber(ARGV[2])
local out = {now, 0}
local leases = {}

-- Lease the members (their records exist unless noted) and append them to the reply.
local function hand_out(members)
  if #members == 0 then
    return
  end
  local _, records = call_chunked('HMGET', KEYS[3], members)
  local gone = {}
  for i, member in ipairs(members) do
    if records[i] then
      leases[#leases + 1] = deadline
      leases[#leases + 1] = member
      out[#out + 1] = member
      out[#out + 1] = records[i]
    else
      gone[#gone + 1] = member
    end
  end
  call_chunked('ZREM', KEYS[2], gone)
end

local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
hand_out(expired)
out[2] = (#out - 2) / 2

local room = limit - out[2]
if room > 0 then
  local edge = now - tonumber(ARGV[4])
  local half = math.floor(room / 2)
  local on_time = {}
  if half > 0 then
    on_time = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. edge, now, 'LIMIT', 0, half)
  end
  local overdue = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', edge, 'LIMIT', 0, room - #on_time)
  if #on_time + #overdue < room and #on_time == half then
    local more = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. edge, now, 'LIMIT', #on_time,
                            room - #on_time - #overdue)
    for _, member in ipairs(more) do
      on_time[#on_time + 1] = member
    end
  end
  call_chunked('ZREM', KEYS[1], overdue)
  call_chunked('ZREM', KEYS[1], on_time)
  hand_out(overdue)
  hand_out(on_time)
end
call_chunked('ZADD', KEYS[2], leases)
return out
