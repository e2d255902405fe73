--[[
ack: forget records that Kafka acknowledged on their target (or on the DLQ).

KEYS[1]  in-flight      ZSET  member -> lease deadline ms
KEYS[2]  records        HASH  member -> encoded record
ARGV     members

Returns: the number of records removed.
]]
local removed = 0
for i = 1, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  removed = removed + redis.call('HDEL', KEYS[2], ARGV[i])
end
return removed
