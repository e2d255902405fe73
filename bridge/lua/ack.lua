--[[
ack: forget records that Kafka acknowledged on their target (or on the DLQ).

An acknowledged offset is no longer pending even if a copy of it is still queued (re-read after
Redis lost data): that copy is a duplicate, so the offset's pending bit is cleared regardless.

KEYS[1]  in-flight      ZSET  offset -> lease deadline ms
KEYS[2]  claimed        HASH  offset -> member
KEYS[3]  low index      ZSET  offset bucket -> 0
KEYS[4]  pending        HASH  offset bucket -> bitmap of its pending offsets
ARGV     offsets (8 bytes each)

Returns: the number of records removed.
]]
call_chunked('ZREM', KEYS[1], ARGV)
local removed = call_chunked('HDEL', KEYS[2], ARGV)
mark_pending(KEYS[4], KEYS[3], ARGV, false)
return removed
