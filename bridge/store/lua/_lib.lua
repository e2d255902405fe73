--[[
_lib: prepended to every script by bridge.store when it registers them (not a script itself).

LANE (set by bridge.store.scripts from bridge.store.keys.LANE_WIDTH, before this file), LANES,
due_of(score): priority lanes in the due index. A record's score is its due ms plus
its lane's base (bridge.store.keys.score): LANES lists the bases of the high, normal and low lanes,
in the order they are claimed, each lane the scores [base, base + LANE). due_of gives the due ms a
score stands for.

wait_key(waits, target): the wait index of a rate-limited target's records (egress.max_rate_per_target)
in a shard, from the name of the shard's waits SET (`<shard>:waits` -> `<shard>:wait:<target>`, as
bridge.store.keys names it). A script reaches a shard's wait indexes through the SET, which lists
the targets that have one; they share the shard's hash tag, so its Cluster slot.
wait_keys(waits, under): the wait indexes the SET `waits` lists, named as under the SET `under`
(default: `waits` itself). waiting_keys(due, waits): the shard's due index, then those.
undeclared(first, needed): a script that reaches wait indexes declares them after its own keys,
from KEYS[first] on (bridge.store.scripts keeps the list per shard); nil when every key in
`needed` is declared, else the reply {"undeclared", every needed key} for the caller to run the
script again with them. Called before any write: Redis Cluster routes and migrates by declared
keys (an undeclared key half-way through a slot migration is refused as "non local").

now_ms(given): the time as epoch milliseconds: `given` when a test passes one, else Redis TIME,
so every replica reads one clock whatever its own says.

append_grouped(groups, order, key, item): group items by key, keys in order of appearance.

call_chunked(command, key, list, options): one variadic command over `list` in slices of CHUNK
items, so a batch of any size passes Lua's unpack limit.

mark_pending(pending, low, members, on): set or clear the pending bit of each member's offset.
A member starts with its offset as 8 big-endian bytes; the first 7 are its bucket (offset // 256),
the 8th its bit. A bucket with any bit set has a 32-byte bitmap in the pending HASH and an entry
(score 0, so entries sort as bytes, i.e. by offset) in the low ZSET; the last bit cleared removes
both, so the lowest pending offset is read without scanning records (low.lua).

is_pending(pending, offset, maps): whether the offset (8 big-endian bytes) has its pending bit set;
`maps`, if given, keeps the bitmaps read (a script that asks for many offsets reads each once).

stored_id(member): the delay-id its producer gave a stored record (a due index member: its offset's
8 bytes, then bridge.message.encode's form), or nil when it has the default one. It reads the
form as decode does: the id is a length-prefixed field, or the first delay-id header's value.

id_entry(offset, due, timestamp) / read_id_entry(entry): an id index entry — the record's offset
(8 bytes), its due ms (not its score: a reference's lane is not known until it is read back) and
its record timestamp, "<offset><due>:<timestamp>" — and its three parts (timestamp 0 if absent).

withdraw(shard, id, not_after): remove the waiting record the id index of `shard` names for `id`
(a cancel or a replacement); returns whether one was waiting. `shard` names the keys: due, ids,
low, pending, inflight, refs, waits. With `not_after` (a record timestamp: a cancel or replacement
read in another partition of the topic), only a record stamped no later is withdrawn — a schedule
produced after the cancel stands. An entry whose record is neither waiting nor in flight
(delivered meanwhile) is dropped. The entry gives the due ms, not the lane: each lane is looked
in, in the due index, then in the wait indexes of rate-limited targets; a record in none of them,
not in flight yet pending, is a reference: its pending bit cleared, it is never read back.
withdrawing(first): the shard table withdraw and withdraw_at take, from KEYS[first..first+6] in
that order (due, ids, low, pending, inflight, refs, waits), or the reply {"undeclared", ...} when
the call left out a wait index (declared from KEYS[first + 7] on).
withdraw_at(shard, offset, due) does the same for the record at `offset` due at `due` (-1: a
reference, or not waiting), however it is known: a default delay-id is not in the id index.

ack(keys, argv, first): forget records Kafka acknowledged (ack.lua; claim.lua takes the
acknowledgements of its shard along, saving a call). argv[first] is the epoch the records were
claimed in, argv[first + 1] n, then n offsets (8 bytes each), then to the end pairs (delay-id,
offset) for those with a caller-given delay-id; keys are {in-flight, claimed, low, pending, id
index, meta}. Acknowledgements of another epoch than the shard's (meta "epoch", set when
incarnation.lua retires its state) are dropped: their records were retired, where the mover
delivers them again, and the offsets now belong to other records. An acknowledged offset is no
longer pending even if a copy of it is still queued (re-read after Redis lost data): that copy is
a duplicate, so its pending bit is cleared regardless. A delay-id leaves the id index with its
record, unless the index already names a later record with that id (a replacement scheduled while
this one was in flight). Returns the number of records removed.
]]
local LANES = {-LANE, 0, LANE}

-- A number as integer text: Lua's own formatting keeps 14 digits, a lane's scores have up to 16.
local function int(x)
  return string.format('%d', x)
end

local function due_of(score)
  local s = tonumber(score)
  if s < 0 then
    return s + LANE
  elseif s >= LANE then
    return s - LANE
  end
  return s
end

local function wait_key(waits, target)
  return string.sub(waits, 1, -2) .. ':' .. target
end

local function wait_keys(waits, under)
  local keys = {}
  for _, target in ipairs(redis.call('SMEMBERS', waits)) do
    keys[#keys + 1] = wait_key(under or waits, target)
  end
  return keys
end

local function waiting_keys(due, waits)
  local keys = wait_keys(waits)
  table.insert(keys, 1, due)
  return keys
end

local function undeclared(first, needed)
  local declared = {}
  for i = first, #KEYS do
    declared[KEYS[i]] = true
  end
  for _, key in ipairs(needed) do
    if not declared[key] then
      local reply = {'undeclared'}
      for _, k in ipairs(needed) do
        reply[#reply + 1] = k
      end
      return reply
    end
  end
  return nil
end

local function now_ms(given)
  if given ~= nil and given ~= '' then
    return tonumber(given)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local CHUNK = 1000

-- redis.call(command, key, <options>, <items of list>), in slices of CHUNK items (CHUNK is even,
-- so score/member and field/value pairs never split); returns the replies summed when they are
-- integers, else concatenated.
local function call_chunked(command, key, list, options)
  local total, joined = 0, {}
  for first = 1, #list, CHUNK do
    local last = math.min(first + CHUNK - 1, #list)
    local reply
    if options then
      local args = {unpack(options)}
      for i = first, last do
        args[#args + 1] = list[i]
      end
      reply = redis.call(command, key, unpack(args))
    else
      reply = redis.call(command, key, unpack(list, first, last))
    end
    if type(reply) == 'table' then
      for i = 1, #reply do
        joined[#joined + 1] = reply[i]
      end
    else
      total = total + reply
    end
  end
  return total, joined
end

-- Append `item` to the list of `key` in `groups`, noting a new key's first appearance in `order`.
local function append_grouped(groups, order, key, item)
  local list = groups[key]
  if not list then
    list = {}
    groups[key] = list
    order[#order + 1] = key
  end
  list[#list + 1] = item
end

local NO_BITS = string.rep('\0', 32)

local function mark_pending(pending, low, members, on)
  local bits, buckets = {}, {}
  for _, member in ipairs(members) do
    append_grouped(bits, buckets, string.sub(member, 1, 7), string.byte(member, 8))
  end
  if #buckets == 0 then
    return
  end
  local _, maps = call_chunked('HMGET', pending, buckets)
  -- Records fall due in another order than their offsets, so an acknowledgement typically
  -- touches a bucket for one or two offsets: only the bytes whose bits change are rewritten, and
  -- a bucket is written back only if it changed.
  local put, listed, gone = {}, {}, {}
  for i, bucket in ipairs(buckets) do
    local old = maps[i] or NO_BITS
    local map = old
    for _, n in ipairs(bits[bucket]) do
      local j, mask = math.floor(n / 8) + 1, bit.lshift(1, n % 8)
      local byte = string.byte(map, j)
      local changed
      if on then
        changed = bit.bor(byte, mask)
      else
        changed = bit.band(byte, bit.bnot(mask))
      end
      if changed ~= byte then
        map = string.sub(map, 1, j - 1) .. string.char(changed) .. string.sub(map, j + 1)
      end
    end
    if map ~= NO_BITS then
      if map ~= old then
        put[#put + 1] = bucket
        put[#put + 1] = map
      end
      -- Setting bits lists the bucket even if it had some (then it is listed already): cheap
      -- where offsets run in order, as in adds, and the index stays whole whatever came before.
      if on then
        listed[#listed + 1] = 0
        listed[#listed + 1] = bucket
      end
    elseif maps[i] then
      gone[#gone + 1] = bucket
    end
  end
  call_chunked('HSET', pending, put)
  call_chunked('ZADD', low, listed)
  call_chunked('HDEL', pending, gone)
  call_chunked('ZREM', low, gone)
end

local function is_pending(pending, offset, maps)
  local bucket = string.sub(offset, 1, 7)
  local map = maps and maps[bucket]
  if map == nil then
    map = redis.call('HGET', pending, bucket)
    if maps then
      maps[bucket] = map
    end
  end
  if not map then
    return false
  end
  local n = string.byte(offset, 8)
  return bit.band(string.byte(map, math.floor(n / 8) + 1), bit.lshift(1, n % 8)) ~= 0
end

-- The stored form's flags (bridge.message.encoding: never renumbered) and its delay-id header code.
local TARGET_IN_HEADER, DEFAULT_ID, WIDE_LENGTHS, STORED_AT, ID_IN_HEADER = 1, 2, 4, 8, 16
local MANY_HEADERS, ID_CODE = 128, 5

local function stored_id(member)
  local flags = string.byte(member, 10)
  if bit.band(flags, DEFAULT_ID) ~= 0 then
    return nil
  end
  -- After the offset (8), the version and flags (2) and the due ms (8): the header count.
  local count, pos = struct.unpack('>H', member, 19)
  if bit.band(flags, MANY_HEADERS) ~= 0 then
    count, pos = struct.unpack('>I4', member, pos)
  end
  if bit.band(flags, STORED_AT) ~= 0 then
    pos = pos + 8
  end
  local length, none = '>H', 65535
  if bit.band(flags, WIDE_LENGTHS) ~= 0 then
    length, none = '>I4', 4294967295
  end
  local function field()  -- the next length-prefixed field (nil: absent), pos past it
    local size
    size, pos = struct.unpack(length, member, pos)
    if size == none then
      return nil
    end
    pos = pos + size
    return string.sub(member, pos - size, pos - 1)
  end
  if bit.band(flags, TARGET_IN_HEADER) == 0 then
    field()
  end
  if bit.band(flags, ID_IN_HEADER) == 0 then
    return field() or ''
  end
  field()  -- the key
  field()  -- the value
  for _ = 1, count do
    local code = string.byte(member, pos)
    pos = pos + 1
    if code == 0 then
      field()  -- a name not among the known ones
    end
    local data = field()
    if code == ID_CODE then
      return data or ''
    end
  end
  return nil
end

local function id_entry(offset, due, timestamp)
  return offset .. int(due) .. ':' .. timestamp
end

local function read_id_entry(entry)
  local rest = string.sub(entry, 9)
  local colon = string.find(rest, ':', 1, true)
  if not colon then
    return string.sub(entry, 1, 8), tonumber(rest), 0
  end
  return string.sub(entry, 1, 8), tonumber(string.sub(rest, 1, colon - 1)),
    tonumber(string.sub(rest, colon + 1))
end

-- Remove the record at `offset` due at `due` from the ZSET `key`, in whichever lane it is;
-- returns whether it was there.
local function take(key, offset, due)
  for _, base in ipairs(LANES) do
    local score = int(base + due)
    for _, member in ipairs(redis.call('ZRANGEBYSCORE', key, score, score)) do
      if string.sub(member, 1, 8) == offset then
        redis.call('ZREM', key, member)
        return true
      end
    end
  end
  return false
end

-- The record at `offset` due at `due` leaves, wherever it waits (see withdraw above); returns
-- whether it did, and whether it is in flight instead.
local function withdrawing(first)
  local waits = KEYS[first + 6]
  local refused = undeclared(first + 7, wait_keys(waits))
  if refused then
    return nil, refused
  end
  return {due = KEYS[first], ids = KEYS[first + 1], low = KEYS[first + 2],
          pending = KEYS[first + 3], inflight = KEYS[first + 4], refs = KEYS[first + 5],
          waits = waits}
end

local function withdraw_at(shard, offset, due)
  local found = take(shard.due, offset, due)
  if not found then
    for _, target in ipairs(redis.call('SMEMBERS', shard.waits)) do
      local key = wait_key(shard.waits, target)
      if take(key, offset, due) then
        if redis.call('EXISTS', key) == 0 then
          redis.call('SREM', shard.waits, target)
        end
        found = true
        break
      end
    end
  end
  if not found then
    if redis.call('ZSCORE', shard.inflight, offset) then
      return false, true
    end
    if not is_pending(shard.pending, offset) then
      return false, false
    end
    redis.call('HINCRBY', shard.refs, 'count', -1)  -- a reference: never read back now
  end
  mark_pending(shard.pending, shard.low, {offset}, false)
  return true, false
end

local function withdraw(shard, id, not_after)
  local entry = redis.call('HGET', shard.ids, id)
  if not entry then
    return false
  end
  local offset, due, stamped = read_id_entry(entry)
  if not_after and stamped > not_after then
    return false
  end
  local done, in_flight = withdraw_at(shard, offset, due)
  if not in_flight then
    redis.call('HDEL', shard.ids, id)
  end
  return done, offset, due
end

local function ack(keys, argv, first)
  local epoch, n = argv[first], tonumber(argv[first + 1])
  if n == 0 or (redis.call('HGET', keys[6], 'epoch') or '') ~= epoch then
    return 0
  end
  local offsets = {}
  for i = 1, n do
    offsets[i] = argv[first + 1 + i]
  end
  call_chunked('ZREM', keys[1], offsets)
  local removed = call_chunked('HDEL', keys[2], offsets)
  mark_pending(keys[4], keys[3], offsets, false)
  for i = first + n + 2, #argv, 2 do
    local entry = redis.call('HGET', keys[5], argv[i])
    if entry and string.sub(entry, 1, 8) == argv[i + 1] then
      redis.call('HDEL', keys[5], argv[i])
    end
  end
  return removed
end
