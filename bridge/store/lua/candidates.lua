--[[
candidates: what one shard's id index gives for each of a few id hashes (see the id index in
_lib.lua): the records a delay-id with that hash may name, to be confirmed by reading them.
Read only.

KEYS[1]  id index       HASH  buckets of entries: id hash, offset, due ms
ARGV[1..] id hashes (4 bytes each)

Returns: per hash, a list of pairs: offset (8 bytes), due ms
]]
id_prefetch(KEYS[1], ARGV)
local out = {}
for i = 1, #ARGV do
  local flat = {}
  for _, found in ipairs(id_candidates(KEYS[1], ARGV[i])) do
    flat[#flat + 1] = found[1]
    flat[#flat + 1] = found[2]
  end
  out[i] = flat
end
return out
