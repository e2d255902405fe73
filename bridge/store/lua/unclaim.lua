--[[
unclaim: put claimed records back among the waiting ones, as if never claimed, so a cancel or a
replacement reaches them again. Used when the ingress began catching up on their partition while
their claim was on its way, or when a higher priority is still due elsewhere (bridge.egress); and
to hold the records of a rate-limited target (egress.max_rate_per_target) that its rate did not
let through: those wait in the target's wait index, from which they are claimed at that rate, so
that they do not stand in the due index ahead of other targets' records.

KEYS[1]  where they wait  ZSET  member -> score (due ms in its lane): the due index, or ARGV[1]'s
                                wait index
KEYS[2]  in-flight        ZSET  offset -> lease deadline ms
KEYS[3]  claimed          HASH  offset -> member
KEYS[4]  waits            SET   targets with a wait index
ARGV[1]  the target whose wait index KEYS[1] is, or "" for the due index
ARGV[2..] pairs: score, offset (8 bytes)

Returns: the number of records put back (those still in flight; an acknowledged one is gone).
]]
local offsets = {}
for i = 3, #ARGV, 2 do
  offsets[#offsets + 1] = ARGV[i]
end
local _, members = call_chunked('HMGET', KEYS[3], offsets)
local back, gone = {}, {}
for i, offset in ipairs(offsets) do
  if members[i] then
    back[#back + 1] = ARGV[2 * i]
    back[#back + 1] = members[i]
    gone[#gone + 1] = offset
  end
end
call_chunked('ZREM', KEYS[2], gone)
call_chunked('HDEL', KEYS[3], gone)
call_chunked('ZADD', KEYS[1], back)
if ARGV[1] ~= '' and #gone > 0 then
  redis.call('SADD', KEYS[4], ARGV[1])
end
return #gone
