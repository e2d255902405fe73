--[[
ack: forget records that Kafka acknowledged on their target (or on the DLQ).

KEYS[1]  in-flight      ZSET  member -> lease deadline ms
KEYS[2]  records        HASH  member -> encoded record
ARGV     members

Returns: the number of records removed.
]]
call_chunked('ZREM', KEYS[1], ARGV)
return (call_chunked('HDEL', KEYS[2], ARGV))
