--[[
ack: forget records that Kafka acknowledged on their target (or on the DLQ).

An acknowledged offset is no longer pending even if a copy of it is still queued (re-read after
Redis lost data): that copy is a duplicate, so the offset's pending bit is cleared regardless. A
record with a caller-given delay-id leaves the id index with it, unless the index already names a
later record with that id (a replacement scheduled while this one was in flight).

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
local n = tonumber(ARGV[1])
local offsets = {}
for i = 2, n + 1 do
  offsets[#offsets + 1] = ARGV[i]
end
call_chunked('ZREM', KEYS[1], offsets)
local removed = call_chunked('HDEL', KEYS[2], offsets)
mark_pending(KEYS[4], KEYS[3], offsets, false)
for i = n + 2, #ARGV, 2 do
  local entry = redis.call('HGET', KEYS[5], ARGV[i])
  if entry and string.sub(entry, 1, 8) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[5], ARGV[i])
  end
end
return removed
