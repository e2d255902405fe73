--[[
release: end the lease of in-flight records now, so the next claim hands them out again.

Used when a delivery failed transiently or the bridge stops with records unacknowledged.
Members no longer in flight (acknowledged meanwhile) are left alone.

KEYS[1]  in-flight      ZSET  member -> lease deadline ms
ARGV     members

Returns: the number of leases ended.
]]
local released = 0
for i = 1, #ARGV do
  released = released + redis.call('ZADD', KEYS[1], 'XX', 'CH', 0, ARGV[i])
end
return released
