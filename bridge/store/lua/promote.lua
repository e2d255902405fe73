--[[
promote: store the records of one chunk of references whole, now that the read-back has read them
from the delay topic, and drop the references it read — atomically, so a chunk is promoted once.

The caller read the chunk (its first `bytes` bytes) and passes, for each reference in it, the
member to store: the record read back, or a record for the DLQ (its payload was gone, or it no
longer passes the rules). A reference whose pending bit is clear was cancelled or replaced while
it waited: its member is not stored. A retired incarnation keeps the pending bits it had (nothing
cancels into it after the retire); one retired before they were kept (no field "pending" in its
references) has none to look at: all its members are stored.

The chunk must still start with the reference the caller read first and hold at least the bytes
it read; otherwise another caller promoted it, or adds renamed it (a chunk that fills up), and
nothing is written. References appended after the caller read the chunk stay for the next read.

KEYS[1]  due index      ZSET  member -> score (due ms in its lane)
KEYS[2]  references     HASH  chunk -> references (16 bytes each); "count" -> references waiting;
                             "promoted" -> calls that stored records (see add.lua, ARGV[4])
KEYS[3]  chunk index    ZSET  chunk -> its bucket's start ms
KEYS[4]  pending        HASH  offset bucket -> bitmap of its pending offsets
KEYS[5]  targets        HASH  target -> records held whole (see _lib.lua): each record stored
                             counts there from now on
ARGV[1]  the chunk's field
ARGV[2]  how many bytes of it the caller read
ARGV[3]  its first reference (16 bytes)
ARGV[4]  "1" for a retired incarnation, else "0"
ARGV[5..] pairs, one per reference read, in the chunk's order: score, member

Returns: records stored, or -1 when the chunk is not the one the caller read
]]
local chunk = redis.call('HGET', KEYS[2], ARGV[1])
local read = tonumber(ARGV[2])
if not chunk or #chunk < read or string.sub(chunk, 1, 16) ~= ARGV[3] then
  return -1
end
local retired = ARGV[4] == '1' and redis.call('HGET', KEYS[2], 'pending') ~= '1'
local due, maps = {}, {}
for i = 5, #ARGV, 2 do
  local member = ARGV[i + 1]
  if retired or is_pending(KEYS[4], string.sub(member, 1, 8), maps) then
    due[#due + 1] = ARGV[i]
    due[#due + 1] = member
  end
end
call_chunked('ZADD', KEYS[1], due)
local stored = #due / 2
local counts = new_counts()
for i = 2, #due, 2 do
  count(counts, due[i], 1)
end
write_counts(KEYS[5], counts)
if #chunk > read then
  redis.call('HSET', KEYS[2], ARGV[1], string.sub(chunk, read + 1))
else
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
end
if stored > 0 then
  redis.call('HINCRBY', KEYS[2], 'count', -stored)
  redis.call('HINCRBY', KEYS[2], 'promoted', 1)  -- see add.lua, ARGV[4]
end
return stored
