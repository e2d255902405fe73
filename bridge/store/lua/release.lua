--[[
release: end the lease of in-flight records, so a claim hands them out again — at once, or after a
back-off when their delivery keeps failing (a target or DLQ that refuses records must not make the
mover spin).

Used when a delivery failed transiently or the bridge stops with records unacknowledged.
Offsets no longer in flight (acknowledged meanwhile) are left alone.

KEYS[1]  in-flight      ZSET  offset -> lease deadline ms
ARGV[1]  ms from now until they may be claimed again (0: at once)
ARGV[2..] offsets (8 bytes each)

Returns: the number of leases changed.
]]
local at = 0
if tonumber(ARGV[1]) > 0 then
  at = now_ms() + tonumber(ARGV[1])
end
local leases = {}
for i = 2, #ARGV do
  leases[#leases + 1] = at
  leases[#leases + 1] = ARGV[i]
end
return (call_chunked('ZADD', KEYS[1], leases, {'XX', 'CH'}))
