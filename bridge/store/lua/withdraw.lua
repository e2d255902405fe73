--[[
withdraw: cancels and replacements read in another partition of the shard's delay topic: remove
the waiting records they name here (a schedule's identity is its delay topic and delay-id).

The caller looked up the id index (candidates.lua) and read each candidate in the delay topic: it
passes only records that carry the delay-id of the cancel or replacement and are stamped no later
than it (a schedule produced after the cancel stands). Run by the ingress for the cancels and the
records with a caller-given id that add.lua found nothing for in their own partition. A record
in flight stays (its entry goes stale with its acknowledgement); one gone meanwhile has its entry
dropped. A recurring schedule the shard's registry has at a record named ends there, as a cancel
read in its own partition ends it (add.lua): the record carrying it on is not stored.

KEYS[1]  due index      ZSET  member -> score (due ms in its lane)
KEYS[2]  id index       HASH  buckets of entries: id hash, offset, due ms (see _lib.lua)
KEYS[3]  low index      ZSET  offset bucket -> 0
KEYS[4]  pending        HASH  offset bucket -> bitmap of its pending offsets
KEYS[5]  in-flight      ZSET  offset -> lease deadline ms
KEYS[6]  references     HASH  "count" -> references waiting
KEYS[7]  waits          SET   targets with a wait index
KEYS[8]  targets        HASH  target -> records held whole (see _lib.lua)
KEYS[9]  schedules      HASH  the schedule registry (see add.lua)
KEYS[10..] the wait indexes the SET lists (see undeclared in _lib.lua)
ARGV[1..] quadruples: the id hash, the record's offset (8 bytes), its due ms (as the index has it)
          and its delay-id

Returns: W, the offset (8 bytes) of each of the W records withdrawn, E, the offset of each of the E
records named that were not withdrawn but where the registry had a schedule, ended there (its
occurrence in flight or acknowledged: the journal says so, as a withdrawal of that record, so
that a rebuild ends it there too), then the offset of each record named that neither was
withdrawn nor ended its schedule because the registry has the schedule at a later record now:
carried on since the caller looked (the caller looks again)
| {"undeclared", wait indexes...}
]]
local shard, refused = withdrawing(1, 10)
if refused then
  return refused
end
local reg = schedule_registry(KEYS[9], redis.call('EXISTS', KEYS[9]) == 1)
local withdrawn, ended_at, moved = {}, {}, {}
for i = 1, #ARGV, 4 do
  local done, in_flight = withdraw_at(shard, ARGV[i + 1], tonumber(ARGV[i + 2]))
  -- A schedule at that record ends there: waiting, in flight, or its occurrence acknowledged
  -- and the record carrying it on not read yet (candidates.lua gives that one too).
  local ended = reg.end_at(ARGV[i + 3], ARGV[i + 1], decimal_of(ARGV[i + 1]))
  if done then
    withdrawn[#withdrawn + 1] = ARGV[i + 1]
  elseif ended then
    ended_at[#ended_at + 1] = ARGV[i + 1]
  else
    -- Carried on since the caller looked (its owner is another replica): the caller looks again.
    local _, at = reg.state(reg.get(ARGV[i + 3]))
    if at and tonumber(at) > tonumber(decimal_of(ARGV[i + 1])) then
      moved[#moved + 1] = ARGV[i + 1]
    end
  end
  if not in_flight then
    id_drop(shard.ids, ARGV[i], ARGV[i + 1])
  end
end
id_flush()
local out = {}
for _, list in ipairs({withdrawn, ended_at}) do
  out[#out + 1] = #list
  for _, offset in ipairs(list) do
    out[#out + 1] = offset
  end
end
for _, offset in ipairs(moved) do
  out[#out + 1] = offset
end
return out
