--[[
withdraw: cancels and replacements read in another partition of the shard's delay topic: remove
the waiting records they name here (a schedule's identity is its delay topic and delay-id).

Each comes with its record timestamp: only a record stamped no later is withdrawn, so a schedule
produced after the cancel stands (see withdraw in _lib.lua). Run by the ingress for the cancels
and the records with a caller-given id that add.lua found nothing for in their own partition.

KEYS[1]  due index      ZSET  member -> score (due ms in its lane)
KEYS[2]  id index       HASH  delay-id -> id_entry (offset, due ms, record timestamp)
KEYS[3]  low index      ZSET  offset bucket -> 0
KEYS[4]  pending        HASH  offset bucket -> bitmap of its pending offsets
KEYS[5]  in-flight      ZSET  offset -> lease deadline ms
KEYS[6]  references     HASH  "count" -> references waiting
KEYS[7]  waits          SET   targets with a wait index
KEYS[8..] the wait indexes the SET lists (see undeclared in _lib.lua)
ARGV[1..] pairs: delay-id, record timestamp of the cancel or replacement

Returns: triples for what was withdrawn here: the delay-id, the record's offset (8 bytes) and its
         due ms (-1: a reference) | {"undeclared", wait indexes...}
]]
local shard, refused = withdrawing(1)
if refused then
  return refused
end
local withdrawn = {}
for i = 1, #ARGV, 2 do
  local done, offset, due = withdraw(shard, ARGV[i], tonumber(ARGV[i + 1]))
  if done then
    withdrawn[#withdrawn + 1] = ARGV[i]
    withdrawn[#withdrawn + 1] = offset
    withdrawn[#withdrawn + 1] = due
  end
end
return withdrawn
