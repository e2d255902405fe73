--[[
claim: hand out up to a batch of due records of one shard under a lease.

Records whose lease has expired (claimed, never acknowledged) come first and are counted as
redeliveries; then records whose due time has come, in (due, offset) order. Each is moved into
the in-flight set with the lease deadline. "Now" is Redis TIME unless a test passes it.

KEYS[1]  due index      ZSET  member -> due ms
KEYS[2]  in-flight      ZSET  member -> lease deadline ms
KEYS[3]  records        HASH  member -> encoded record
ARGV[1]  batch limit (records)
ARGV[2]  lease length ms
ARGV[3]  now ms, or "" to read Redis TIME

Returns: {now ms, redelivered count, member, record, member, record, ...}
]]
local now = now_ms(ARGV[3])
local limit = tonumber(ARGV[1])
local deadline = now + tonumber(ARGV[2])
local out = {now, 0}
local taken = 0

local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
for _, member in ipairs(expired) do
  local record = redis.call('HGET', KEYS[3], member)
  if record then
    redis.call('ZADD', KEYS[2], deadline, member)
    out[#out + 1] = member
    out[#out + 1] = record
    out[2] = out[2] + 1
    taken = taken + 1
  else
    redis.call('ZREM', KEYS[2], member)
  end
end

if taken < limit then
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit - taken)
  for _, member in ipairs(due) do
    redis.call('ZREM', KEYS[1], member)
    local record = redis.call('HGET', KEYS[3], member)
    if record then
      redis.call('ZADD', KEYS[2], deadline, member)
      out[#out + 1] = member
      out[#out + 1] = record
    end
  end
end
return out
