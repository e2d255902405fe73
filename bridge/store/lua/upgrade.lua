--[[
upgrade: move up to a batch of one shard's records from the earlier store layout into this one.

The earlier layout kept every record twice: its 8-byte offset in the due or in-flight ZSET and
the encoded record in a HASH under it. A waiting record becomes one due-index member (offset +
encoded record) with the same due time; an in-flight one keeps its offset and lease deadline,
with the member in the claimed HASH. Either way its offset's pending bit is set. The old records
HASH is deleted once both old ZSETs are empty (a record in it without an index entry had been
delivered). The low index is shared.

KEYS[1]  old due index  ZSET  offset -> due ms
KEYS[2]  old in-flight  ZSET  offset -> lease deadline ms
KEYS[3]  old records    HASH  offset -> encoded record
KEYS[4]  due index      ZSET  member -> due ms
KEYS[5]  in-flight      ZSET  offset -> lease deadline ms
KEYS[6]  claimed        HASH  offset -> member
KEYS[7]  low index      ZSET  offset bucket -> 0
KEYS[8]  pending        HASH  offset bucket -> bitmap of its pending offsets
ARGV[1]  batch limit (records)

Returns: {records moved, 1 if old records remain else 0}
]]
-- Take up to `limit` entries off `from`; returns how many, and the {score, offset, member}
-- triples of those whose record exists.
local function take(from, limit)
  if limit <= 0 then
    return 0, {}
  end
  local old = redis.call('ZRANGE', from, 0, limit - 1, 'WITHSCORES')
  local offsets = {}
  for i = 1, #old, 2 do
    offsets[#offsets + 1] = old[i]
  end
  if #offsets == 0 then
    return 0, {}
  end
  local _, records = call_chunked('HMGET', KEYS[3], offsets)
  local found = {}
  for i, offset in ipairs(offsets) do
    if records[i] then
      found[#found + 1] = {old[2 * i], offset, offset .. records[i]}
    end
  end
  call_chunked('ZREM', from, offsets)
  call_chunked('HDEL', KEYS[3], offsets)
  return #offsets, found
end

local limit = tonumber(ARGV[1])
local taken, leased = take(KEYS[2], limit)
local _, waiting = take(KEYS[1], limit - taken)
local leases, claimed, due, members = {}, {}, {}, {}
for _, r in ipairs(leased) do
  leases[#leases + 1] = r[1]
  leases[#leases + 1] = r[2]
  claimed[#claimed + 1] = r[2]
  claimed[#claimed + 1] = r[3]
  members[#members + 1] = r[3]
end
for _, r in ipairs(waiting) do
  due[#due + 1] = r[1]
  due[#due + 1] = r[3]
  members[#members + 1] = r[3]
end
call_chunked('ZADD', KEYS[5], leases)
call_chunked('HSET', KEYS[6], claimed)
call_chunked('ZADD', KEYS[4], due)
mark_pending(KEYS[8], KEYS[7], members, true)
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then
  return {#members, 1}
end
redis.call('DEL', KEYS[3])
return {#members, 0}
