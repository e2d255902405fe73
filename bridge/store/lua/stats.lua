--[[
stats: backlog figures of one shard for the metrics, in O(log n) whatever the backlog size.

A record in flight was due by its claim time plus the claim-ahead window (egress.ahead), which is
its lease deadline minus (lease - ahead): the oldest of those counts too, so a record claimed but
never delivered (Kafka unreachable) keeps aging in the gauge, and one claimed ahead does not.

KEYS[1]  due index      ZSET  member -> score (due ms in its lane)
KEYS[2]  in-flight      ZSET  member -> lease deadline ms
KEYS[3]  references     HASH  "count" -> references waiting
KEYS[4]  waits          SET   targets with a wait index: their records count as the due index's
KEYS[5..] the wait indexes the SET lists (see undeclared in _lib.lua)
ARGV[1]  now ms, or "" to read Redis TIME
ARGV[2]  egress.lease - egress.ahead in ms, or "" to leave records in flight out of the oldest

Returns: {"undeclared", wait indexes...} | {now ms, scheduled (due later), overdue (due, unclaimed), in flight, oldest due ms or -1,
          references, overdue high, overdue normal, overdue low}
]]
local refused = undeclared(5, wait_keys(KEYS[4]))
if refused then
  return refused
end
local now = now_ms(ARGV[1])
local out = {now, 0, 0, redis.call('ZCARD', KEYS[2]), -1, 0}
local overdue, waiting = 0, 0
for lane = 1, #LANES do
  out[6 + lane] = 0
end
for _, key in ipairs(waiting_keys(KEYS[1], KEYS[4])) do
  waiting = waiting + redis.call('ZCARD', key)
  for lane, base in ipairs(LANES) do
    local due = redis.call('ZCOUNT', key, int(base), int(base + now))
    out[6 + lane] = out[6 + lane] + due
    overdue = overdue + due
    if due > 0 then
      local first = tonumber(redis.call('ZRANGEBYSCORE', key, int(base), int(base + now),
        'WITHSCORES', 'LIMIT', 0, 1)[2]) - base
      if out[5] < 0 or first < out[5] then
        out[5] = first
      end
    end
  end
end
out[2] = waiting - overdue
out[3] = overdue
if out[4] > 0 and ARGV[2] ~= '' then
  local due_by = tonumber(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]) - tonumber(ARGV[2])
  if due_by <= now and (out[5] < 0 or due_by < out[5]) then
    out[5] = due_by
  end
end
out[6] = tonumber(redis.call('HGET', KEYS[3], 'count') or '0')
return out
