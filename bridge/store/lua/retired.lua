--[[
retired: forget a retired incarnation of a shard (see incarnation.lua) once the mover has
delivered all its records and none is left to read back.

KEYS[1]  retired            SET   labels of retired incarnations
KEYS[2]  retired due index  ZSET  member -> due ms
KEYS[3]  retired in-flight  ZSET  offset -> lease deadline ms
KEYS[4]  retired claimed    HASH  offset -> member
KEYS[5]  retired references HASH  chunk -> references
KEYS[6]  retired chunk index ZSET chunk -> its bucket's start ms
KEYS[7]  retired waits      SET   targets with a wait index (records waiting for their rate)
KEYS[8]  retired pending    HASH  offset bucket -> bitmap (kept for its references)
KEYS[9]  retired meta       HASH  "topic_id" -> the retired incarnation's topic id
KEYS[10] retired targets    HASH  target -> records held whole (empty by now)
ARGV[1]  the label

Returns: 1 if it was empty and is forgotten, else 0 (records left)
]]
if redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[6])
    + redis.call('SCARD', KEYS[7]) > 0 then
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8], KEYS[9], KEYS[10])
redis.call('SREM', KEYS[1], ARGV[1])
return 1
