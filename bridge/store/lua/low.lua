--[[
low: the lowest offset of one shard that Redis does not yet account for, the offset to commit.

Every offset below it was either delivered (or dead-lettered) and acknowledged, so re-reading the
delay topic from it after Redis lost its data rebuilds every pending record. It is the lowest
pending record's offset, or watermark + 1 when nothing is pending — or lower, the lowest cancel
or replacement still to be looked for in the topic's other partitions (KEYS[5], see add.lua):
read again from there, it is looked for again.

The lowest bucket of the low index has the lowest pending offset as its lowest set bit
(mark_pending in _lib.lua keeps the two in step). A bucket without pending bits (which
mark_pending never leaves: a defence) is dropped and the next one read, at most ARGV[2] buckets per
call; reaching that bound returns the start of the next bucket, which is still at or below the
lowest pending offset.

KEYS[1]  meta           HASH  "ingested" -> highest offset handled, "withdrawing" -> earlier
                              code's KEYS[5] (the next add moves it there)
KEYS[2]  low index      ZSET  offset bucket -> 0
KEYS[3]  pending        HASH  offset bucket -> bitmap of its pending offsets
KEYS[4]  schedules      HASH  the schedule registry (see add.lua)
KEYS[5]  withdrawing    ZSET  entries still to be looked for in other partitions -> offset
ARGV[1]  the watermark the caller expects, or "" when it knows none
ARGV[2]  the most buckets to read
ARGV[3]  how long (ms) the registry keeps the marker of a schedule a cancel or a record with its
         id ended: by then every record carried on from before that cancel has been read. Each
         call looks at a few of the registry's entries (HSCAN, its cursor in field "#cursor")
         and forgets the markers older than that.

Returns: {0, watermark, the lowest pending offset as 8 bytes (or lower: see above), or ""}
       | {1, -1, ""} shard state missing | {2, watermark, ""} watermark below the expected one
]]
local mark, across = unpack(redis.call('HMGET', KEYS[1], 'ingested', 'withdrawing'))
if not mark then
  return {1, -1, ''}
end
if ARGV[1] ~= '' and tonumber(mark) < tonumber(ARGV[1]) then
  return {2, tonumber(mark), ''}
end
-- The lowest pending offset as 8 bytes ('' for none).
local function lowest_pending()
  for _ = 1, tonumber(ARGV[2]) do
    local bucket = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not bucket then
      return ''
    end
    local map = redis.call('HGET', KEYS[3], bucket) or ''
    for j = 1, #map do
      local byte = string.byte(map, j)
      for n = 0, 7 do
        if bit.band(byte, bit.lshift(1, n)) ~= 0 then
          return bucket .. string.char((j - 1) * 8 + n)
        end
      end
    end
    redis.call('HDEL', KEYS[3], bucket)
    redis.call('ZREM', KEYS[2], bucket)
  end
  local next_bucket = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  return next_bucket and next_bucket .. string.char(0) or ''
end

-- Forget the markers of ended schedules older than `keep_ms`, a few entries a call.
local function sweep_registry(keep_ms)
  if redis.call('EXISTS', KEYS[4]) == 0 then
    return
  end
  local reply = redis.call('HSCAN', KEYS[4], redis.call('HGET', KEYS[4], '#cursor') or '0',
    'COUNT', 100)
  local now, gone, fields = now_ms(''), {}, reply[2]
  for i = 1, #fields, 2 do
    local at = string.match(fields[i + 1], '^%-%d+:(%d+)')
    if at and now - tonumber(at) > keep_ms then
      gone[#gone + 1] = fields[i]
    end
  end
  call_chunked('HDEL', KEYS[4], gone)
  if reply[1] == '0' then
    redis.call('HDEL', KEYS[4], '#cursor')
  else
    redis.call('HSET', KEYS[4], '#cursor', reply[1])
  end
end
sweep_registry(tonumber(ARGV[3]))

local low = lowest_pending()
-- Of what is still to be looked for in other partitions (offsets stay below 2^53).
local first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
local lowest = first[2] and tonumber(first[2])
for offset in string.gmatch(across or '', '(%d+):%d+') do  -- kept by earlier code, not moved yet
  lowest = math.min(lowest or tonumber(offset), tonumber(offset))
end
if lowest then
  local hi, lo = 0, 0
  if low ~= '' then
    hi, lo = struct.unpack('>I4I4', low)
  end
  if low == '' or lowest < hi * 4294967296 + lo then
    hi = math.floor(lowest / 4294967296)
    low = struct.pack('>I4I4', hi, lowest - hi * 4294967296)
  end
end
return {0, tonumber(mark), low}
