--[[
add: apply a batch of one shard's delay-topic records in offset order — schedules, replacements
and cancels — and advance its ingest watermark, atomically.

A scheduled record is one member of the due index: its offset as 8 big-endian bytes, then the
encoded record, scored by its due time — so records due at the same time sort in offset order, and
a record costs Redis one entry. A record with a caller-given delay-id is also named in the id index
(delay-id -> its offset's 8 bytes and its due ms), and only such a record: a later record with the
same id replaces it while it waits, and a cancel (no due time) withdraws it. A record already
claimed is past both: the replacement is simply scheduled, the cancel finds nothing.

A record whose offset is at or below the watermark was applied before (and may since have been
delivered and removed), so it is skipped: reading the same delay-topic record twice applies it
once, and re-reading a partition from an earlier offset gives the same final state.

The caller passes the watermark it last saw for the shard. If the shard's state is gone, or its
watermark is below that, Redis lost writes (data wiped, or a restart from an AOF missing its last
second): nothing is written and the caller re-reads the delay topic from a point Redis still
covers (see bridge.ingress).

KEYS[1]  due index      ZSET  member -> due time (epoch ms)
KEYS[2]  meta           HASH  field "ingested" -> highest offset handled
KEYS[3]  low index      ZSET  offset bucket -> 0 (see _lib.lua, mark_pending)
KEYS[4]  pending        HASH  offset bucket -> bitmap of its pending offsets
KEYS[5]  id index       HASH  delay-id -> offset (8 bytes) .. due ms
KEYS[6]  in-flight      ZSET  offset -> lease deadline ms
ARGV[1]  the watermark the caller expects, or "" when it knows none
ARGV[2]  highest offset of the batch, including records sent to the DLQ instead of stored
ARGV[3..] groups of four, ascending offsets: offset, due ms, member, delay-id — the delay-id ""
          unless the caller gave one; a cancel is offset, "", "", delay-id

Returns: {0, records added, replaced, cancelled, cancels that found nothing, then the offset
          and delay-id of each of the first 10 cancels that found nothing}
       | {1, -1} shard state missing | {2, watermark} watermark went back
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

-- Remove the waiting record the id index names for `id`; returns whether one was waiting. An
-- entry whose record is neither waiting nor in flight (delivered meanwhile) is dropped.
local function withdraw(id)
  local entry = redis.call('HGET', KEYS[5], id)
  if not entry then
    return false
  end
  local offset, due = string.sub(entry, 1, 8), string.sub(entry, 9)
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], due, due)) do
    if string.sub(member, 1, 8) == offset then
      redis.call('ZREM', KEYS[1], member)
      redis.call('HDEL', KEYS[5], id)
      mark_pending(KEYS[4], KEYS[3], {offset}, false)
      return true
    end
  end
  if not redis.call('ZSCORE', KEYS[6], offset) then
    redis.call('HDEL', KEYS[5], id)
  end
  return false
end

local watermark = tonumber(mark or '-1')
local due, members = {}, {}
local added, replaced, cancelled, missing = 0, 0, 0, 0
local missed = {}
for i = 3, #ARGV, 4 do
  if tonumber(ARGV[i]) > watermark then
    local due_ms, member, id = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
    if due_ms == '' then
      if withdraw(id) then
        cancelled = cancelled + 1
      else
        missing = missing + 1
        if missing <= 10 then
          missed[#missed + 1] = ARGV[i]
          missed[#missed + 1] = id
        end
      end
    elseif id == '' then
      -- No id, so nothing later in the batch can withdraw it: written in one go at the end.
      due[#due + 1] = due_ms
      due[#due + 1] = member
      members[#members + 1] = member
    else
      if withdraw(id) then
        replaced = replaced + 1
      end
      redis.call('ZADD', KEYS[1], due_ms, member)
      redis.call('HSET', KEYS[5], id, string.sub(member, 1, 8) .. due_ms)
      mark_pending(KEYS[4], KEYS[3], {member}, true)
      added = added + 1
    end
  end
end
call_chunked('ZADD', KEYS[1], due)
mark_pending(KEYS[4], KEYS[3], members, true)
if tonumber(ARGV[2]) > watermark then
  redis.call('HSET', KEYS[2], 'ingested', ARGV[2])
end
return {0, added + #members, replaced, cancelled, missing, unpack(missed)}
