--[[
low: the lowest offset of one shard that Redis does not yet account for, the offset to commit.

Every offset below it was either delivered (or dead-lettered) and acknowledged, so re-reading the
delay topic from it after Redis lost its data rebuilds every pending record. It is the lowest
pending record's offset, or watermark + 1 when nothing is pending.

The low index holds offset buckets (offset // 256 as 7 bytes) that may still hold pending records.
The lowest bucket is probed member by member (HEXISTS on the records hash); an empty bucket is
dropped and the next one probed, at most ARGV[2] buckets per call. Reaching that bound returns the
start of the next bucket, which is still at or below the lowest pending offset.

KEYS[1]  records        HASH  member -> encoded record
KEYS[2]  meta           HASH  field "ingested" -> highest offset handled
KEYS[3]  low index      ZSET  offset bucket -> 0
ARGV[1]  the watermark the caller expects, or "" when it knows none
ARGV[2]  the most buckets to probe

Returns: {0, watermark, member of the lowest pending record or ""}
       | {1, -1, ""} shard state missing | {2, watermark, ""} watermark below the expected one
]]
local mark = redis.call('HGET', KEYS[2], 'ingested')
if not mark then
  return {1, -1, ''}
end
if ARGV[1] ~= '' and tonumber(mark) < tonumber(ARGV[1]) then
  return {2, tonumber(mark), ''}
end
for _ = 1, tonumber(ARGV[2]) do
  local bucket = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not bucket then
    return {0, tonumber(mark), ''}
  end
  for i = 0, 255 do
    local member = bucket .. string.char(i)
    if redis.call('HEXISTS', KEYS[1], member) == 1 then
      return {0, tonumber(mark), member}
    end
  end
  redis.call('ZREM', KEYS[3], bucket)
end
local next_bucket = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if next_bucket then
  return {0, tonumber(mark), next_bucket .. string.char(0)}
end
return {0, tonumber(mark), ''}
