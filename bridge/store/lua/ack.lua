--[[
ack: forget records that Kafka acknowledged on their target (or on the DLQ); see ack() in _lib.lua.

KEYS[1]  in-flight      ZSET  offset -> lease deadline ms
KEYS[2]  claimed        HASH  offset -> member
KEYS[3]  low index      ZSET  offset bucket -> 0
KEYS[4]  pending        HASH  offset bucket -> bitmap of its pending offsets
KEYS[5]  id index       HASH  buckets of entries: id hash, offset, due ms (see _lib.lua)
KEYS[6]  meta           HASH  "epoch" -> the state's epoch (none until a retire); "written" -> when
                              Redis last took a write of the shard (epoch ms, its clock)
KEYS[7]  targets        HASH  target -> records held whole (see _lib.lua)
ARGV[1]  the epoch the records were claimed in ("" before any retire)
ARGV[2]  n, the number of offsets
ARGV[3..n+2]  offsets (8 bytes each)
ARGV[n+3]     how many of them have a caller-given delay-id (their id index entries go stale)
ARGV[n+4..]   T, then T target names, then 2 bytes per offset: the number of its record's target
              among them (see named_targets in _lib.lua); T = 0: the script reads each record's
              target from the record itself

Returns: the number of records removed (0 when the epoch is not the shard's).
]]
return ack(KEYS, ARGV, 1, now_ms(''))
