--[[
take_over: end the leases of a shard's records that its new owner does not hold itself, so its
next claim hands them out again at once (as redeliveries).

The consumer group is the lease's owner: a partition assigned to a replica is no longer anyone
else's, so the records its earlier owner claimed and never acknowledged — it crashed, or it is the
same replica's previous life — need not wait for their leases to run out. Records the caller holds
itself (still in flight from an earlier assignment of the partition) keep their leases. A lease
another replica took meanwhile by mistake (a zombie) ends too: at worst a duplicate, never a loss.

KEYS[1]  in-flight      ZSET  offset -> lease deadline ms
ARGV[1..] offsets (8 bytes each) the caller holds in flight: their leases stay

Returns: the number of leases ended.
]]
local held = {}
for _, offset in ipairs(ARGV) do
  held[offset] = true
end
local now = now_ms()
local leased = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
local ended = {}
for _, offset in ipairs(leased) do
  if not held[offset] then
    ended[#ended + 1] = now
    ended[#ended + 1] = offset
  end
end
call_chunked('ZADD', KEYS[1], ended, {'XX'})
return #ended / 2
