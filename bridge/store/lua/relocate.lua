--[[
relocate: move one shard's keys from their names before every key started with the key prefix
("{<prefix>:<topic>:<partition>}:<name>") to the current ones ("<prefix>:{<topic>:<partition>}:
<name>"), so that one ACL key pattern "~<prefix>:*" covers a deployment.

A key that exists only under its old name is renamed. One that exists under both — a bridge of
the earlier build wrote the old names while this one already used the new, as in a rolling
upgrade — is merged into the new one and the old deleted: sorted sets and sets by union (the
earlier due time or lease deadline wins), hashes field by field keeping the new value, except the
meta hash, whose watermark is the higher of the two, and the pending bitmaps, which are OR-ed.
(Standalone Redis and Sentinel only: old and new names hash to different cluster slots, and the
earlier builds did not run on Redis Cluster.)

KEYS     pairs: old name, new name
ARGV     per pair, how to merge: zset | set | hash | meta | bitmaps

Returns: the number of keys moved or merged.
]]
local moved = 0
for i = 1, #KEYS, 2 do
  local old, new, how = KEYS[i], KEYS[i + 1], ARGV[(i + 1) / 2]
  if redis.call('EXISTS', old) == 1 then
    moved = moved + 1
    if redis.call('EXISTS', new) == 0 then
      redis.call('RENAME', old, new)
    else
      if how == 'zset' then
        redis.call('ZUNIONSTORE', new, 2, new, old, 'AGGREGATE', 'MIN')
      elseif how == 'set' then
        redis.call('SUNIONSTORE', new, new, old)
      else
        local fields = redis.call('HGETALL', old)
        for j = 1, #fields, 2 do
          local field, value = fields[j], fields[j + 1]
          local have = redis.call('HGET', new, field)
          if not have then
            redis.call('HSET', new, field, value)
          elseif how == 'meta' and field == 'ingested' and tonumber(value) > tonumber(have) then
            redis.call('HSET', new, field, value)
          elseif how == 'bitmaps' then
            local bytes = {}
            for k = 1, 32 do
              bytes[k] = bit.bor(string.byte(have, k) or 0, string.byte(value, k) or 0)
            end
            redis.call('HSET', new, field, string.char(unpack(bytes)))
          end
        end
      end
      redis.call('DEL', old)
    end
  end
end
return moved
