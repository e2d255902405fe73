--[[
add: store a batch of records of one shard and advance its ingest watermark, atomically.

A record whose offset is at or below the watermark was stored before (and may since have been
delivered and removed), so it is skipped: reading the same delay-topic record twice stores it once.

KEYS[1]  due index      ZSET  member -> due time (epoch ms)
KEYS[2]  records        HASH  member -> encoded record
KEYS[3]  meta           HASH  field "ingested" -> highest offset handled
ARGV[1]  highest offset of the batch, including records sent to the DLQ instead of stored
ARGV[2..] groups of four: offset, member, due ms, encoded record (ascending offsets)

Returns: the number of records added.
]]
local watermark = tonumber(redis.call('HGET', KEYS[3], 'ingested') or '-1')
local added = 0
for i = 2, #ARGV, 4 do
  if tonumber(ARGV[i]) > watermark then
    redis.call('HSET', KEYS[2], ARGV[i + 1], ARGV[i + 3])
    redis.call('ZADD', KEYS[1], ARGV[i + 2], ARGV[i + 1])
    added = added + 1
  end
end
if tonumber(ARGV[1]) > watermark then
  redis.call('HSET', KEYS[3], 'ingested', ARGV[1])
end
return added
