--[[
add: store a batch of records of one shard and advance its ingest watermark, atomically.

A record is one member of the due index: its offset as 8 big-endian bytes, then the encoded
record, scored by its due time — so records due at the same time sort in offset order, and a
record costs Redis one entry.

A record whose offset is at or below the watermark was stored before (and may since have been
delivered and removed), so it is skipped: reading the same delay-topic record twice stores it once.

The caller passes the watermark it last saw for the shard. If the shard's state is gone, or its
watermark is below that, Redis lost writes (data wiped, or a restart from an AOF missing its last
second): nothing is written and the caller re-reads the delay topic from a point Redis still
covers (see bridge.ingress).

KEYS[1]  due index      ZSET  member -> due time (epoch ms)
KEYS[2]  meta           HASH  field "ingested" -> highest offset handled
KEYS[3]  low index      ZSET  offset bucket -> 0 (see _lib.lua, mark_pending)
KEYS[4]  pending        HASH  offset bucket -> bitmap of its pending offsets
ARGV[1]  the watermark the caller expects, or "" when it knows none
ARGV[2]  highest offset of the batch, including records sent to the DLQ instead of stored
ARGV[3..] groups of three: offset, due ms, member (ascending offsets)

Returns: {0, records added} | {1, -1} shard state missing | {2, watermark} watermark went back
]]
local mark = redis.call('HGET', KEYS[2], 'ingested')
if ARGV[1] ~= '' then
  if not mark then
    return {1, -1}
  end
  if tonumber(mark) < tonumber(ARGV[1]) then
    return {2, tonumber(mark)}
  end
end
local watermark = tonumber(mark or '-1')
local due, members = {}, {}
for i = 3, #ARGV, 3 do
  if tonumber(ARGV[i]) > watermark then
    due[#due + 1] = ARGV[i + 1]
    due[#due + 1] = ARGV[i + 2]
    members[#members + 1] = ARGV[i + 2]
  end
end
call_chunked('ZADD', KEYS[1], due)
mark_pending(KEYS[4], KEYS[3], members, true)
if tonumber(ARGV[2]) > watermark then
  redis.call('HSET', KEYS[2], 'ingested', ARGV[2])
end
return {0, #members}
