--[[
unclaim: put claimed records back among the waiting ones, as if never claimed, so a cancel or a
replacement reaches them again. Used when the ingress began catching up on their partition while
their claim was on its way (bridge.egress): a cancel of theirs may still be unread.

KEYS[1]  due index  ZSET  member -> score (due ms in its lane)
KEYS[2]  in-flight  ZSET  offset -> lease deadline ms
KEYS[3]  claimed    HASH  offset -> member
ARGV     pairs: score, offset (8 bytes)

Returns: the number of records put back (those still in flight; an acknowledged one is gone).
]]
local offsets = {}
for i = 2, #ARGV, 2 do
  offsets[#offsets + 1] = ARGV[i]
end
local _, members = call_chunked('HMGET', KEYS[3], offsets)
local back, gone = {}, {}
for i, offset in ipairs(offsets) do
  if members[i] then
    back[#back + 1] = ARGV[2 * i - 1]
    back[#back + 1] = members[i]
    gone[#gone + 1] = offset
  end
end
call_chunked('ZREM', KEYS[2], gone)
call_chunked('HDEL', KEYS[3], gone)
call_chunked('ZADD', KEYS[1], back)
return #gone
