--[[
next_due: when the mover of one shard next has work: the earliest due time or lease deadline.

KEYS[1]  due index      ZSET  member -> due ms
KEYS[2]  in-flight      ZSET  member -> lease deadline ms

Returns: {now ms (Redis TIME), earliest due ms or -1, earliest lease deadline ms or -1}
]]
local now = now_ms()
local due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {now, tonumber(due[2] or '-1'), tonumber(lease[2] or '-1')}
