--[[
ack: forget records that Kafka acknowledged on their target (or on the DLQ); see ack() in _lib.lua.

KEYS[1]  in-flight      ZSET  offset -> lease deadline ms
KEYS[2]  claimed        HASH  offset -> member
KEYS[3]  low index      ZSET  offset bucket -> 0
KEYS[4]  pending        HASH  offset bucket -> bitmap of its pending offsets
KEYS[5]  id index       HASH  delay-id -> offset (8 bytes) .. due ms
ARGV[1]  n, the number of offsets
ARGV[2..n+1]  offsets (8 bytes each)
ARGV[n+2..]   pairs: delay-id, offset — the acknowledged records with a caller-given delay-id

Returns: the number of records removed.
]]
return ack(KEYS, ARGV, 1)
