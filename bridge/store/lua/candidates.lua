--[[
candidates: what one shard's id index gives for each of a few id hashes (see the id index in
_lib.lua): the records a delay-id with that hash may name, to be confirmed by reading them.
Read only.

KEYS[1]  id index       HASH  buckets of entries: id hash, offset, due ms
KEYS[2]  pending        HASH  offset bucket -> bitmap of its pending offsets
ARGV[1..] id hashes (5 bytes each)

Returns: per hash, a list of pairs: offset (8 bytes), due ms — of records still pending (a stale
entry, its record acknowledged, is left out: nothing to read)
]]
id_prefetch(KEYS[1], ARGV)
local out = {}
for i = 1, #ARGV do
  local flat = {}
  for _, found in ipairs(id_candidates(KEYS[1], ARGV[i])) do
    if is_pending(KEYS[2], found[1]) then
      flat[#flat + 1] = found[1]
      flat[#flat + 1] = found[2]
    end
  end
  out[i] = flat
end
return out
