--[[
stats: backlog figures of one shard for the metrics, in O(log n) whatever the backlog size.

A record in flight was due by its claim time plus the claim-ahead window (egress.ahead), which is
its lease deadline minus (lease - ahead): the oldest of those counts too, so a record claimed but
never delivered (Kafka unreachable) keeps aging in the gauge, and one claimed ahead does not.

KEYS[1]  due index      ZSET  member -> due ms
KEYS[2]  in-flight      ZSET  member -> lease deadline ms
KEYS[3]  references     HASH  "count" -> references waiting
ARGV[1]  now ms, or "" to read Redis TIME
ARGV[2]  egress.lease - egress.ahead in ms, or "" to leave records in flight out of the oldest

Returns: {now ms, scheduled (due later), overdue (due, unclaimed), in flight, oldest due ms or -1,
          references}
]]
local now = now_ms(ARGV[1])
local overdue = redis.call('ZCOUNT', KEYS[1], '-inf', now)
local scheduled = redis.call('ZCARD', KEYS[1]) - overdue
local inflight = redis.call('ZCARD', KEYS[2])
local oldest = -1
if overdue > 0 then
  oldest = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2])
end
if inflight > 0 and ARGV[2] ~= '' then
  local due_by = tonumber(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]) - tonumber(ARGV[2])
  if due_by <= now and (oldest < 0 or due_by < oldest) then
    oldest = due_by
  end
end
local references = tonumber(redis.call('HGET', KEYS[3], 'count') or '0')
return {now, scheduled, overdue, inflight, oldest, references}
