--[[
release: end the lease of in-flight records now, so the next claim hands them out again.

Used when a delivery failed transiently or the bridge stops with records unacknowledged.
Offsets no longer in flight (acknowledged meanwhile) are left alone.

KEYS[1]  in-flight      ZSET  offset -> lease deadline ms
ARGV     offsets (8 bytes each)

Returns: the number of leases ended.
]]
local leases = {}
for i = 1, #ARGV do
  leases[#leases + 1] = 0
  leases[#leases + 1] = ARGV[i]
end
return (call_chunked('ZADD', KEYS[1], leases, {'XX', 'CH'}))
