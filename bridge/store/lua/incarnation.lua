--[[
incarnation: bind a shard to one incarnation of its delay topic (Kafka's topic id), and retire the
state of an earlier one.

A topic deleted and created again under the same name starts its offsets at 0 again, so the
shard's watermark and pending offsets belong to the old topic and would make the bridge skip the
new one's records. When the stored topic id differs from the current one (or the caller forces it,
because the partition's offsets went back), the old incarnation's records — waiting, in flight and
referenced (far-future records the read-back will find gone: they reach the DLQ as payload-missing
at their due time) — move under the retired keys, where the mover still delivers them, and the
shard starts empty: no watermark, no pending offsets, and a new epoch (the label), so that
acknowledgements of records claimed before are not applied to the new records at their offsets
(see ack() in _lib.lua). A shard without a stored topic id adopts the current one.

KEYS[1]  due index          ZSET  member -> due ms
KEYS[2]  in-flight          ZSET  offset -> lease deadline ms
KEYS[3]  claimed            HASH  offset -> member
KEYS[4]  meta               HASH  "ingested" -> watermark, "topic_id" -> incarnation, "epoch" -> the
                                label of its last retire
KEYS[5]  low index          ZSET  offset bucket -> 0
KEYS[6]  pending            HASH  offset bucket -> bitmap of its pending offsets
KEYS[7]  retired            SET   labels of retired incarnations still holding records
KEYS[8]  retired due index  (the names KEYS[1..3] take under the label ARGV[2])
KEYS[9]  retired in-flight
KEYS[10] retired claimed
KEYS[11] id index         HASH  delay-id -> offset .. due ms (dropped: the new incarnation's
                                cancels and replacements refer to its own records)
KEYS[12] references       HASH  chunk -> references; "count" -> references waiting
KEYS[13] chunk index      ZSET  chunk -> its bucket's start ms
KEYS[14] retired references, KEYS[15] retired chunk index (under the label ARGV[2])
KEYS[16] waits            SET   targets with a wait index (records waiting for their rate), each
                                moved with the SET to KEYS[17], the retired waits
KEYS[18] retired pending  (KEYS[6] under the label, kept with the references: a reference
                                cancelled before the retire stays cancelled; the retired
                                references' field "pending" says the bits were kept)
KEYS[19] retired meta     HASH  "topic_id" -> the retired incarnation's topic id: its records'
                                journal entries name it (a claim of them returns it)
KEYS[20] targets         HASH  target -> records held whole (see _lib.lua), moved to KEYS[21]
                                with the records it counts
KEYS[22] schedule registry HASH  id hash -> where a recurring schedule is (see add.lua; dropped
                                as the id index is)
KEYS[23] withdrawing     ZSET  entries kept to look for in other partitions (see add.lua; dropped
                                with the meta: the new incarnation is read from its start)
KEYS[24..] the wait indexes KEYS[16] lists, then their names under KEYS[17] (see undeclared in
           _lib.lua)
ARGV[1]  the topic id now, or "" when it could not be read (the stored one is kept)
ARGV[2]  the label to retire under
ARGV[3]  "1" to retire even if the topic id is unchanged

A retire asked again under the same label (its reply was lost: the caller keeps the label until
it has one) is answered as it was the first time, from the meta's "retire" field.

Returns: {"undeclared", wait indexes...}
       | {0, stored id or ""} bound, nothing retired
       | {1, stored id or "", records retired, watermark or -1} the old state retired
]]
local waits_now, waits_retired = wait_keys(KEYS[16]), wait_keys(KEYS[16], KEYS[17])
for _, key in ipairs(waits_retired) do
  waits_now[#waits_now + 1] = key
end
local refused = undeclared(24, waits_now)
if refused then
  return refused
end
if redis.call('HGET', KEYS[4], 'epoch') == ARGV[2] then
  local done = redis.call('HGET', KEYS[4], 'retire')
  if done then
    local was, moved, mark = string.match(done, '^(.*) (%-?%d+) (%-?%d+)$')
    return {1, was, tonumber(moved), tonumber(mark)}
  end
end
local stored = redis.call('HGET', KEYS[4], 'topic_id')
local id = ARGV[1]
if id == '' then
  id = stored or ''
end
if ARGV[3] ~= '1' and (not stored or stored == id) then
  if not stored and id ~= '' then
    redis.call('HSET', KEYS[4], 'topic_id', id)
  end
  return {0, stored or ''}
end
local mark = tonumber(redis.call('HGET', KEYS[4], 'ingested') or '-1')
local moved = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
  + tonumber(redis.call('HGET', KEYS[12], 'count') or '0')
for _, target in ipairs(redis.call('SMEMBERS', KEYS[16])) do
  local key = wait_key(KEYS[16], target)
  if redis.call('EXISTS', key) == 1 then
    moved = moved + redis.call('ZCARD', key)
    redis.call('RENAME', key, wait_key(KEYS[17], target))
  end
end
if redis.call('EXISTS', KEYS[16]) == 1 then
  redis.call('RENAME', KEYS[16], KEYS[17])
end
if redis.call('EXISTS', KEYS[20]) == 1 then
  redis.call('RENAME', KEYS[20], KEYS[21])
end
for i = 1, 3 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('RENAME', KEYS[i], KEYS[7 + i])
  end
end
if redis.call('EXISTS', KEYS[12]) == 1 then
  redis.call('RENAME', KEYS[12], KEYS[14])
  redis.call('HSET', KEYS[14], 'pending', '1')
  if redis.call('EXISTS', KEYS[6]) == 1 then
    redis.call('RENAME', KEYS[6], KEYS[18])
  end
end
if redis.call('EXISTS', KEYS[13]) == 1 then
  redis.call('RENAME', KEYS[13], KEYS[15])
end
if moved > 0 then
  redis.call('SADD', KEYS[7], ARGV[2])
  if stored then
    redis.call('HSET', KEYS[19], 'topic_id', stored)
  end
else  -- what is left of its references (all cancelled) is nobody's to read
  redis.call('DEL', KEYS[14], KEYS[15], KEYS[18])
end
redis.call('DEL', KEYS[4], KEYS[5], KEYS[6], KEYS[11], KEYS[22], KEYS[23])
redis.call('HSET', KEYS[4], 'epoch', ARGV[2], 'retire',
  (stored or '') .. ' ' .. moved .. ' ' .. mark)
if id ~= '' then
  redis.call('HSET', KEYS[4], 'topic_id', id)
end
return {1, stored or '', moved, mark}
