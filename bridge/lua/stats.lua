--[[
stats: backlog figures of one shard for the metrics, in O(log n) whatever the backlog size.

KEYS[1]  due index      ZSET  member -> due ms
KEYS[2]  in-flight      ZSET  member -> lease deadline ms
ARGV[1]  now ms, or "" to read Redis TIME

Returns: {now ms, scheduled (due later), overdue (due, unclaimed), in flight, oldest due ms or -1}
]]
local now = now_ms(ARGV[1])
local overdue = redis.call('ZCOUNT', KEYS[1], '-inf', now)
local scheduled = redis.call('ZCARD', KEYS[1]) - overdue
local inflight = redis.call('ZCARD', KEYS[2])
local oldest = -1
if overdue > 0 then
  oldest = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2])
end
return {now, scheduled, overdue, inflight, oldest}
