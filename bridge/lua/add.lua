--[[
add: store a batch of records of one shard and advance its ingest watermark, atomically.

A record whose offset is at or below the watermark was stored before (and may since have been
delivered and removed), so it is skipped: reading the same delay-topic record twice stores it once.

The caller passes the watermark it last saw for the shard. If the shard's state is gone, or its
watermark is below that, Redis lost writes (data wiped, or a restart from an AOF missing its last
second): nothing is written and the caller re-reads the delay topic from a point Redis still
covers (see bridge.ingress).

Every stored offset's bucket (the member's first 7 bytes: offset // 256) joins the low index, a
ZSET whose members all score 0 and so sort as bytes, i.e. by offset; low.lua reads it.

KEYS[1]  due index      ZSET  member -> due time (epoch ms)
KEYS[2]  records        HASH  member -> encoded record
KEYS[3]  meta           HASH  field "ingested" -> highest offset handled
KEYS[4]  low index      ZSET  offset bucket -> 0
ARGV[1]  the watermark the caller expects, or "" when it knows none
ARGV[2]  highest offset of the batch, including records sent to the DLQ instead of stored
ARGV[3..] groups of four: offset, member, due ms, encoded record (ascending offsets)

Returns: {0, records added} | {1, -1} shard state missing | {2, watermark} watermark went back
]]
local mark = redis.call('HGET', KEYS[3], 'ingested')
if ARGV[1] ~= '' then
  if not mark then
    return {1, -1}
  end
  if tonumber(mark) < tonumber(ARGV[1]) then
    return {2, tonumber(mark)}
  end
end
local watermark = tonumber(mark or '-1')
local records, due, buckets = {}, {}, {}
local bucket = nil
for i = 3, #ARGV, 4 do
  if tonumber(ARGV[i]) > watermark then
    local member = ARGV[i + 1]
    records[#records + 1] = member
    records[#records + 1] = ARGV[i + 3]
    due[#due + 1] = ARGV[i + 2]
    due[#due + 1] = member
    if string.sub(member, 1, 7) ~= bucket then
      bucket = string.sub(member, 1, 7)
      buckets[#buckets + 1] = 0
      buckets[#buckets + 1] = bucket
    end
  end
end
call_chunked('HSET', KEYS[2], records)
call_chunked('ZADD', KEYS[1], due)
call_chunked('ZADD', KEYS[4], buckets)
if tonumber(ARGV[2]) > watermark then
  redis.call('HSET', KEYS[3], 'ingested', ARGV[2])
end
return {0, #due / 2}
