--[[
settle: forget records of one shard whose fate the journal holds, wherever Redis still keeps them:
what a rollback (a failover that lost writes, an AOF tail) put back after they were delivered,
cancelled, replaced or dead-lettered — waiting in an index, a reference, or in flight under a lease
whose acknowledgement was lost. Run by the ingress when it finds a shard's writes lost, before the
shard's claims resume (bridge.positions), so none of them is delivered again.

KEYS[1]  claimed        HASH  offset -> member
KEYS[2]  due index      ZSET  member -> score (due ms in its lane)
KEYS[3]  id index       HASH  buckets of entries: id hash, offset, due ms (see _lib.lua)
KEYS[4]  low index      ZSET  offset bucket -> 0
KEYS[5]  pending        HASH  offset bucket -> bitmap of its pending offsets
KEYS[6]  in-flight      ZSET  offset -> lease deadline ms
KEYS[7]  references     HASH  "count" -> references waiting
KEYS[8]  waits          SET   targets with a wait index
KEYS[9]  targets        HASH  target -> records held whole (see _lib.lua)
KEYS[10..] the wait indexes the SET lists (see undeclared in _lib.lua)
ARGV[1]  "1": forget records in flight too; "0": leave them leased (a take-over's
         reconciliation looks them up: bridge.journal.reconcile)
ARGV[2..] triples: the record's offset (8 bytes), its due ms, the hash of its caller-given
          delay-id ("": none)

Returns: the number of records removed | {"undeclared", wait indexes...}
]]
local shard, refused = withdrawing(2)
if refused then
  return refused
end
local removed = 0
local leased_too = ARGV[1] == '1'
for i = 2, #ARGV, 3 do
  local offset = ARGV[i]
  local done = false
  local claimed = redis.call('HGET', KEYS[1], offset)
  if claimed then
    if leased_too then
      redis.call('HDEL', KEYS[1], offset)
      count_members(KEYS[9], {claimed}, -1)
      redis.call('ZREM', shard.inflight, offset)
      mark_pending(shard.pending, shard.low, {offset}, false)
      done = true
    end
  else
    done = withdraw_at(shard, offset, tonumber(ARGV[i + 1]))
  end
  if done then
    removed = removed + 1
    if ARGV[i + 2] ~= '' then
      id_drop(shard.ids, ARGV[i + 2], offset)
    end
  end
end
id_flush()
return removed
