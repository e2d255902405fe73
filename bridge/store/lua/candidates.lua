--[[
candidates: what one shard's id index gives for each of a few id hashes (see the id index in
_lib.lua): the records a delay-id with that hash may name, to be confirmed by reading them.
Read only.

KEYS[1]  id index       HASH  buckets of entries: id hash, offset, due ms
KEYS[2]  pending        HASH  offset bucket -> bitmap of its pending offsets
KEYS[3]  schedules      HASH  the schedule registry (see add.lua)
KEYS[4]  meta           HASH  field "ingested" -> the shard's watermark (see add.lua)
ARGV[1..] pairs: an id hash (5 bytes), and the delay-id

Returns: per pair, a list of pairs: offset (8 bytes), due ms — of records still pending (a stale
entry, its record acknowledged, is left out: nothing to read), then the record a live recurring
schedule with that hash is at when it is not among them, due -1 (its occurrence acknowledged, the
record carrying it on not read yet: a cancel read elsewhere ends the schedule there, withdraw.lua);
then 1 when Redis holds the shard's state (a watermark), 2 when it does and its owner reads it
again after Redis lost it, not yet up to where it ended (meta "reread", see add.lua), 0 when it
does not (lost, or none yet)
]]
local hashes = {}
for i = 1, #ARGV, 2 do
  hashes[#hashes + 1] = ARGV[i]
end
id_prefetch(KEYS[1], hashes)
local reg = schedule_registry(KEYS[3], redis.call('EXISTS', KEYS[3]) == 1)
local out = {}
for i = 1, #ARGV, 2 do
  local flat, listed = {}, {}
  for _, found in ipairs(id_candidates(KEYS[1], ARGV[i])) do
    if is_pending(KEYS[2], found[1]) then
      flat[#flat + 1] = found[1]
      flat[#flat + 1] = found[2]
      listed[found[1]] = true
    end
  end
  local _, at = reg.state(reg.any and reg.get(ARGV[i + 1]))
  if at and not listed[offset8(at)] then
    flat[#flat + 1] = offset8(at)
    flat[#flat + 1] = -1
  end
  out[#out + 1] = flat
end
local mark, reread = unpack(redis.call('HMGET', KEYS[4], 'ingested', 'reread'))
out[#out + 1] = not mark and 0 or reread and 2 or 1
return out
