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

remove_run(key, run): remove from the ZSET `key` a run of members a ZRANGEBYSCORE ... LIMIT 0 n
just returned (consecutive in its order): by the rank of its first member, so exactly those
leave whatever else the ZSET holds, without ZREM looking up and passing every member.

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

stored_target(member): the target topic of a stored record (a due index member), as decode reads
it: a length-prefixed field, or the first delay-target-topic header's value.

The targets HASH (`…:targets`) counts, per target topic, the records a shard holds whole: waiting
in the due index or a wait index, or in flight — not references (limits.max_waiting_per_target and
delay_bridge_waiting_messages read it). Every script that stores or forgets a record counts it
there, in the same call: add and promote store (+1); an acknowledgement, a withdrawal or a settle
forgets (-1); a claim and an unclaim only move a record, and count nothing. A count that reaches
0 leaves the HASH, and so does one that would go below (records stored by a version that kept
no counts, forgotten by one that does: they were never counted). On the hot paths (add, ack) the caller names each record's target
(named_targets(argv, at), target_of(names, numbers, item)), so no record is read for it; where
it does not, and in the rare paths, the script reads it from the record (target_if_any: a
record whose bytes do not read as one, corrupted in Redis, is not counted and stops nothing; nor
is a target named ""). new_counts(),
tally(counts, target, n), count(counts, member, n), write_counts(key, counts): add n for a target
or per member's target, one HINCRBY per
target at the write; count_members(key, members, n) the three in one.

where(offset, due) / read_where(hint): where a record waits, as a caller names it (the `where`
of a cancel of a default delay-id, see add.lua): its offset (8 bytes), then its due ms as text.

The id index (`…:ids`, a HASH) holds no delay-id. An entry is ID_ENTRY bytes: the id's hash
(ID_HASH bytes: bridge.store.ids hashes the delay topic and the id, the caller passes it), the
record's offset (its low 6 bytes: an offset of 2^48 or more is refused, a partition of 281
trillion records) and its due ms (6 bytes, big-endian: not its score, a reference's lane is not
known until it is read back). Entries are packed into bucket fields, so Redis's cost per field is
shared by a bucket's entries (bench/id_index_layouts.py). Linear hashing keeps a bucket at ID_LOAD
entries on average at any size: field "#" holds "count:level:split:stale:cursor:fresh" (an index
written before the last three had none stale); a hash h lives in bucket h mod 2^level (h: the
hash's last 4 bytes), or h mod 2^(level+1) when that is below `split`; an entry added past the
load splits bucket `split` in two by the hash's next bit. A bucket's field is its number; an empty
bucket has none. Hashes of different ids may be equal: a match is a candidate, confirmed by the
record itself (withdraw below). An acknowledged record's entry is left in place, stale (its
offset no longer pending), and swept with others of its bucket later (id_went), so an
acknowledgement does not rewrite a bucket per record. `count` includes the stale.
id_candidates(ids, hash): {offset, due} of each entry with this hash, stale ones too.
id_put(ids, hash, offset, due) / id_drop(ids, hash, offset, stale): add an entry; remove the one
with this hash and offset (none: nothing happens; `stale`: it was). A call keeps what it read and
changed of an index and writes it at id_flush(), which a script that changes one calls before it
returns; id_prefetch(ids, hashes) reads the buckets of a batch's hashes in one call.
id_went(ids, pending, n): n records with entries were acknowledged; sweeps if a quarter is stale.

withdraw(shard, id, hash, vouched, before): remove the waiting record of this shard with delay-id
`id` (a cancel or a replacement in its own partition); returns whether one was waiting, then its
offset and due ms (none waiting: false, nil, nil, and whether a candidate was in flight). `shard` names the keys: due, ids, low, pending, inflight, refs, waits. Each
candidate the index gives for the hash is confirmed: a record held whole by the delay-id its
stored form carries (stored_id); a reference by `vouched`, offset -> the delay-id the caller read
at that offset in the delay topic ("": another record, or none). A candidate in flight stays (its
entry goes stale with its acknowledgement); one neither waiting nor in flight nor pending (a
stale entry) has its entry dropped. A record in none of the due and wait indexes, not in flight
yet pending, is a reference: its pending bit cleared, it is never read back. `before`, when
given, is called with the candidates before any is looked at (add.lua writes the records it held
back if one of them is among them).
unvouched(shard, hashes, vouched): the candidates for `hashes` that are references `vouched` does
not name, as a flat list of offset, due ms: what the caller reads in the delay topic before
withdraw can confirm them.
withdrawing(first, declared): the shard table withdraw and withdraw_at take, from
KEYS[first..first+7] in that order (due, ids, low, pending, inflight, refs, waits, targets), or
the reply {"undeclared", ...} when the call left out a wait index (declared from
KEYS[declared] on; default first + 8).
schedule_registry(key, any): a shard's schedule registry (add.lua's KEYS[11]), by delay-id:
get(id), state(entry) (running or paused, and its record's offset; nil once ended), set(id,
offset or "-" .. the ender's, paused) keeping its counts, end_at(id, offset, by) ending the
schedule live at that record. offset8(text) / decimal_of(8 bytes): an offset as a member starts
with it, and as text.
withdraw_at(shard, offset, due) removes the record at `offset` due at `due` (-1: a reference, or
not waiting) wherever it waits, however it is known; returns whether it did, whether it is in
flight instead, and the member it took (nil: a reference's, or none). It leaves the id index as
it is.

ack(keys, argv, first, now): forget records Kafka acknowledged (ack.lua; claim.lua takes the
acknowledgements of its shard along, saving a call) at ``now`` ms, noted in meta "written": a new
owner reads the journal from then, for what a rollback may have put back (bridge.ingress.settled);
the earliest clock the caller knows, so a clock ahead never starts that read too late.
argv[first] is the epoch the records were claimed in, argv[first + 1] n, then n offsets (8 bytes
each), then how many of them have a caller-given delay-id, then their targets (named_targets);
keys are {in-flight, claimed, low, pending, id index, meta, targets}.
Acknowledgements of another epoch than the shard's (meta "epoch", set when incarnation.lua
retires its state) are dropped: their records were retired, where the mover delivers them
again, and the offsets now belong to other records. An acknowledged offset is no longer pending
even if a copy of it is still queued (re-read after Redis lost data): that copy is a duplicate,
so its pending bit is cleared regardless. The entries of records with a caller-given delay-id go
stale (id_went); once nothing of the shard is pending, the id index goes. Returns the number of
records removed.
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

local function remove_run(key, run)
  if #run > 0 then
    local first = redis.call('ZRANK', key, run[1])
    redis.call('ZREMRANGEBYRANK', key, first, first + #run - 1)
  end
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

-- The pending bitmaps this call read or wrote (pending key .. bucket -> bitmap, false: none):
-- mark_pending keeps it whole, so is_pending reads a bucket from Redis once per call.
local known_maps = {}

-- `byte` (the one of a bitmap holding bit `n`) with that bit set (`on`) or cleared.
local function with_bit(byte, n, on)
  local mask = bit.lshift(1, n % 8)
  if on then
    return bit.bor(byte, mask)
  end
  return bit.band(byte, bit.bnot(mask))
end

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
    local ns = bits[bucket]
    if #ns > 2 then  -- many bits (an add's run of offsets): the bytes edited, then one string
      local bytes = {string.byte(old, 1, #old)}
      for _, n in ipairs(ns) do
        local j = math.floor(n / 8) + 1
        bytes[j] = with_bit(bytes[j], n, on)
      end
      map = string.char(unpack(bytes))
    else  -- a bit or two (an acknowledgement's): only the bytes that change are rewritten
      for _, n in ipairs(ns) do
        local j = math.floor(n / 8) + 1
        local byte = string.byte(map, j)
        local changed = with_bit(byte, n, on)
        if changed ~= byte then
          map = string.sub(map, 1, j - 1) .. string.char(changed) .. string.sub(map, j + 1)
        end
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
    known_maps[pending .. bucket] = map ~= NO_BITS and map
  end
  call_chunked('HSET', pending, put)
  call_chunked('ZADD', low, listed)
  call_chunked('HDEL', pending, gone)
  call_chunked('ZREM', low, gone)
end

-- Pending bits withdrawals cleared in this call and not written yet (pending key .. offset), and
-- the writes owed, while a script defers them (defer_clearing; written by clear_pending).
local cleared, clearing = {}, nil

local function is_pending(pending, offset, maps)
  if cleared[pending .. offset] then
    return false
  end
  local bucket = string.sub(offset, 1, 7)
  local map = maps and maps[bucket]
  if map == nil then
    map = known_maps[pending .. bucket]
    if map == nil then
      map = redis.call('HGET', pending, bucket)
      known_maps[pending .. bucket] = map
    end
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
local MANY_HEADERS, TARGET_CODE, ID_CODE = 128, 1, 5

-- A stored form's head: its flags, its header count, where its fields start, and whether its
-- lengths are wide (4 bytes, not 2).
local function stored_head(member)
  local flags = string.byte(member, 10)
  -- After the offset (8), the version and flags (2) and the due ms (8): the header count.
  local count, pos = struct.unpack('>H', member, 19)
  if bit.band(flags, MANY_HEADERS) ~= 0 then
    count, pos = struct.unpack('>I4', member, pos)
  end
  if bit.band(flags, STORED_AT) ~= 0 then
    pos = pos + 8
  end
  return flags, count, pos, bit.band(flags, WIDE_LENGTHS) ~= 0
end

-- The length-prefixed field at `pos`: its value (nil: absent) and the position after it, or with
-- `skip` only the position (a payload is not copied to be passed over). Per record, so no
-- closure is made per call.
local function stored_field(member, pos, wide, skip)
  local size, at, none
  if wide then
    size, at, none = struct.unpack('>I4', member, pos), pos + 4, 4294967295
  else
    size, at, none = struct.unpack('>H', member, pos), pos + 2, 65535
  end
  if size == none then
    return nil, at
  elseif skip then
    return nil, at + size
  end
  return string.sub(member, at, at + size - 1), at + size
end

-- The value of the first header with name code `wanted` ("" when it has none), nil when there is
-- none, reading `count` headers from `pos` on.
local function stored_header(member, count, pos, wide, wanted)
  local _
  for _n = 1, count do
    local code = string.byte(member, pos)
    pos = pos + 1
    if code == 0 then
      _, pos = stored_field(member, pos, wide, true)  -- a name not among the known ones
    end
    if code == wanted then
      return stored_field(member, pos, wide) or ''
    end
    _, pos = stored_field(member, pos, wide, true)
  end
  return nil
end

-- Past the key and the value at `pos`.
local function past_payload(member, pos, wide)
  local _
  _, pos = stored_field(member, pos, wide, true)
  _, pos = stored_field(member, pos, wide, true)
  return pos
end

local function stored_id(member)
  local flags, count, pos, wide = stored_head(member)
  local _
  if bit.band(flags, DEFAULT_ID) ~= 0 then
    return nil
  end
  if bit.band(flags, TARGET_IN_HEADER) == 0 then
    _, pos = stored_field(member, pos, wide, true)
  end
  if bit.band(flags, ID_IN_HEADER) == 0 then
    return stored_field(member, pos, wide) or ''
  end
  return stored_header(member, count, past_payload(member, pos, wide), wide, ID_CODE)
end

local function stored_target(member)
  local flags, count, pos, wide = stored_head(member)
  local _
  if bit.band(flags, TARGET_IN_HEADER) == 0 then
    return stored_field(member, pos, wide) or ''
  end
  if bit.band(flags, DEFAULT_ID + ID_IN_HEADER) == 0 then
    _, pos = stored_field(member, pos, wide, true)  -- the delay-id
  end
  return stored_header(member, count, past_payload(member, pos, wide), wide, TARGET_CODE) or ''
end

-- Per-target counts of the records a shard holds whole (see the targets HASH above).
local function new_counts()
  return {by = {}, order = {}}
end

-- The target of a stored record, nil for one whose bytes do not read as a stored record
-- (corrupted in Redis, or written by another program): it is not counted, and stops nothing.
local function target_if_any(member)
  local ok, target = pcall(stored_target, member)
  if ok and target ~= '' then
    return target
  end
  return nil
end

local function tally(counts, target, n)
  local by = counts.by
  if by[target] == nil then
    by[target] = 0
    counts.order[#counts.order + 1] = target
  end
  by[target] = by[target] + n
end

local function count(counts, member, n)
  local target = target_if_any(member)
  if target then
    tally(counts, target, n)
  end
end

local function write_counts(key, counts)
  for _, target in ipairs(counts.order) do
    local n = counts.by[target]
    if n ~= 0 and redis.call('HINCRBY', key, target, n) <= 0 then
      redis.call('HDEL', key, target)
    end
  end
  counts.by, counts.order = {}, {}
end

-- Targets a caller names (the list of add.lua's and ack()'s ARGV): `at` is the place of T, then
-- T names, then a string of 2 bytes per item, big-endian, each the number of its item's target
-- in the list (from 1; 0: none). Returns the names, the string and the place after it.
local function named_targets(argv, at)
  local n = tonumber(argv[at])
  local names = {}
  for i = 1, n do
    names[i] = argv[at + i]
  end
  return names, argv[at + n + 1] or '', at + n + 2
end

local function target_of(names, numbers, item)
  local hi, lo = string.byte(numbers, 2 * item - 1, 2 * item)
  return names[(hi or 0) * 256 + (lo or 0)]
end

local function count_members(key, members, n)
  local counts = new_counts()
  for _, member in ipairs(members) do
    count(counts, member, n)
  end
  write_counts(key, counts)
end

local function where(offset, due)
  return offset .. int(due)
end

local function read_where(hint)
  return string.sub(hint, 1, 8), tonumber(string.sub(hint, 9))
end

local ID_HASH, ID_ENTRY, ID_LOAD, ID_MAX_LEVEL = 5, 17, 64, 32
-- An index's state, as field "#" holds it (see the id index above), by position.
local COUNT, LEVEL, SPLIT, STALE, CURSOR, FRESH = 1, 2, 3, 4, 5, 6
local ID_TOP = '\0\0'  -- the 2 high bytes of an offset an entry keeps (its low 6 bytes)

-- What one call read and wrote of each id index: its state (COUNT .. FRESH), its buckets
-- by field ('' for none) and the fields it changed. A call reads a bucket once (id_prefetch reads
-- a batch's in one HMGET) and writes what it changed once, at id_flush: a script that changes an
-- index calls id_flush before it returns.
local id_states, id_buckets, id_dirty = {}, {}, {}

local function id_state(ids)
  local state = id_states[ids]
  if not state then
    state, id_buckets[ids], id_dirty[ids] = {0, 0, 0, 0, 0, 0}, {}, {}
    local stored = redis.call('HGET', ids, '#')
    if stored then
      state = {}
      for n in string.gmatch(stored, '%d+') do
        state[#state + 1] = tonumber(n)
      end
      for i = #state + 1, FRESH do  -- an index written before the sweep: none stale
        state[i] = 0
      end
    end
    id_states[ids] = state
  end
  return state
end

-- The field of the bucket `hash` lives in.
local function id_field(ids, hash)
  local state = id_state(ids)
  local h = struct.unpack('>I4', hash, ID_HASH - 3)
  local b = h % 2 ^ state[LEVEL]
  if b < state[SPLIT] then
    b = h % 2 ^ (state[LEVEL] + 1)
  end
  return int(b)
end

-- Read the buckets of `hashes` not read yet, in one call.
local function id_prefetch(ids, hashes)
  if id_state(ids)[1] == 0 then
    return  -- an empty index: nothing to read (records without an id of their own)
  end
  local fields, seen = {}, {}
  for _, hash in ipairs(hashes) do
    local field = id_field(ids, hash)
    if id_buckets[ids][field] == nil and not seen[field] then
      seen[field] = true
      fields[#fields + 1] = field
    end
  end
  local _, buckets = call_chunked('HMGET', ids, fields)
  for i, field in ipairs(fields) do
    id_buckets[ids][field] = buckets[i] or ''
  end
end

-- The bucket in `field` ('' when empty), read from Redis once per call.
local function id_read(ids, field)
  local bucket = id_buckets[ids][field]
  if bucket == nil then
    bucket = redis.call('HGET', ids, field) or ''
    id_buckets[ids][field] = bucket
  end
  return bucket
end

-- The field of the bucket `hash` lives in, and that bucket ('' when empty).
local function id_bucket(ids, hash)
  local field = id_field(ids, hash)
  return field, id_read(ids, field)
end

local function id_save(ids, field, bucket)
  id_buckets[ids][field] = bucket
  id_dirty[ids][field] = true
end

local function id_flush()
  for ids, state in pairs(id_states) do
    local put, gone = {}, {}
    for field in pairs(id_dirty[ids]) do
      local bucket = id_buckets[ids][field]
      if field == '#' then  -- the state: below
      elseif bucket == '' then
        gone[#gone + 1] = field
      else
        put[#put + 1] = field
        put[#put + 1] = bucket
      end
    end
    if id_dirty[ids]['#'] then
      if state[COUNT] == 0 then
        gone[#gone + 1] = '#'
      else
        put[#put + 1] = '#'
        local fields = {}
        for i, n in ipairs(state) do
          fields[i] = int(n)
        end
        put[#put + 1] = table.concat(fields, ':')
      end
    end
    call_chunked('HSET', ids, put)
    call_chunked('HDEL', ids, gone)
    id_dirty[ids] = {}
  end
end

local function id_set_state(ids, state)
  if state[COUNT] == 0 then
    for i = LEVEL, FRESH do  -- emptied: the index starts over at one bucket, none stale
      state[i] = 0
    end
  end
  id_dirty[ids]['#'] = true
end

-- The 1-based positions in `bucket` of the entries starting with `prefix` (a hash, or a hash and
-- an offset).
local function id_positions(bucket, prefix)
  if #prefix < ID_HASH then
    error('an id index lookup without a hash')
  end
  local found, from = {}, 1
  while from <= #bucket do
    local at = string.find(bucket, prefix, from, true)
    if not at then
      break
    end
    if (at - 1) % ID_ENTRY == 0 then
      found[#found + 1] = at
      from = at + ID_ENTRY
    else
      from = at + 1
    end
  end
  return found
end

local function id_candidates(ids, hash)
  if id_state(ids)[1] == 0 then
    return {}
  end
  local _, bucket = id_bucket(ids, hash)
  local out = {}
  for _, at in ipairs(id_positions(bucket, hash)) do
    local hi, lo = struct.unpack('>HI4', bucket, at + ID_HASH + 6)
    out[#out + 1] = {ID_TOP .. string.sub(bucket, at + ID_HASH, at + ID_HASH + 5), hi * 4294967296 + lo}
  end
  return out
end

-- Split bucket `split` in two by the hash bit above `level`: the entries with it set move to
-- bucket split + 2^level (which has none yet).
local function id_split(ids, level, split)
  local field = int(split)
  local bucket = id_read(ids, field)
  local stay, move = {}, {}
  for at = 1, #bucket, ID_ENTRY do
    local entry = string.sub(bucket, at, at + ID_ENTRY - 1)
    if math.floor(struct.unpack('>I4', entry, ID_HASH - 3) / 2 ^ level) % 2 == 1 then
      move[#move + 1] = entry
    else
      stay[#stay + 1] = entry
    end
  end
  if #move > 0 then
    id_save(ids, field, table.concat(stay))
    id_save(ids, int(split + 2 ^ level), table.concat(move))
  end
end

local function id_put(ids, hash, offset, due)
  local field, bucket = id_bucket(ids, hash)
  local hi = math.floor(due / 4294967296)
  if string.sub(offset, 1, 2) ~= ID_TOP then
    error('offset beyond the id index (2^48): ' .. struct.unpack('>I4', offset))
  end
  local entry = hash .. string.sub(offset, 3) .. struct.pack('>HI4', hi, due - hi * 4294967296)
  id_save(ids, field, bucket .. entry)
  local state = id_state(ids)
  state[COUNT] = state[COUNT] + 1
  local buckets = 2 ^ state[LEVEL] + state[SPLIT]
  if state[COUNT] > ID_LOAD * buckets and state[LEVEL] < ID_MAX_LEVEL then
    id_split(ids, state[LEVEL], state[SPLIT])
    state[SPLIT] = state[SPLIT] + 1
    if state[SPLIT] == 2 ^ state[LEVEL] then
      state[LEVEL], state[SPLIT] = state[LEVEL] + 1, 0
    end
  end
  id_set_state(ids, state)
end

local function id_drop(ids, hash, offset, stale)
  local field, bucket = id_bucket(ids, hash)
  local at = id_positions(bucket, hash .. string.sub(offset, 3))[1]
  if at then
    id_save(ids, field, string.sub(bucket, 1, at - 1) .. string.sub(bucket, at + ID_ENTRY))
    local state = id_state(ids)
    state[COUNT] = state[COUNT] - 1
    if stale then
      state[STALE] = math.max(0, state[STALE] - 1)
    end
    id_set_state(ids, state)
  end
end

-- Drop the stale entries of bucket `field`: those whose offset is no longer pending in `pending`
-- (a record acknowledged, or withdrawn: its entry otherwise goes with it). Returns how many.
local function id_sweep_bucket(ids, pending, field)
  local bucket = id_read(ids, field)
  local kept = {}
  for at = 1, #bucket, ID_ENTRY do
    local entry = string.sub(bucket, at, at + ID_ENTRY - 1)
    if is_pending(pending, ID_TOP .. string.sub(entry, ID_HASH + 1, ID_HASH + 6)) then
      kept[#kept + 1] = entry
    end
  end
  local removed = #bucket / ID_ENTRY - #kept
  if removed > 0 then
    id_save(ids, field, table.concat(kept))
  end
  return removed
end

-- `n` records with entries in the index were acknowledged: their entries stay, stale, until a
-- sweep drops them. Once more than a quarter of the entries are stale, this call sweeps buckets
-- in turn (a cursor over all of them) until they are a quarter again, at most n / 8 + 1 buckets:
-- a bucket is rewritten once for the ~16 stale entries it then holds, not once per record. Each
-- pass over all buckets drops every entry stale when it began, so the count of stale entries
-- (an estimate: an entry a rollback or the journal's settling dropped may be counted) is cut to
-- those added since.
local function id_went(ids, pending, n)
  local state = id_state(ids)
  if n <= 0 or state[COUNT] == 0 then
    return
  end
  state[STALE], state[FRESH] = math.min(state[COUNT], state[STALE] + n), state[FRESH] + n
  local most = math.floor(n / 8) + 1
  while state[STALE] * 4 > state[COUNT] and most > 0 do
    most = most - 1
    local removed = id_sweep_bucket(ids, pending, int(state[CURSOR]))
    state[COUNT], state[STALE] = state[COUNT] - removed, math.max(0, state[STALE] - removed)
    state[CURSOR] = state[CURSOR] + 1
    if state[CURSOR] >= 2 ^ state[LEVEL] + state[SPLIT] then
      state[STALE], state[CURSOR], state[FRESH] = math.min(state[STALE], state[FRESH]), 0, 0
    end
    if state[COUNT] == 0 then
      break
    end
  end
  id_set_state(ids, state)
end

-- Whether the offset (8 big-endian bytes) `a` is below `b`.
local function below(a, b)
  local a1, a2 = struct.unpack('>I4I4', a)
  local b1, b2 = struct.unpack('>I4I4', b)
  return a1 < b1 or (a1 == b1 and a2 < b2)
end

-- Members of one score sort by their bytes, so by offset: the member at `offset` among the
-- `score`'s, found by rank in O(log^2 n) however many share the score (a burst due at one ms).
local function find_by_rank(key, score, offset)
  local low = redis.call('ZCOUNT', key, '-inf', '(' .. score)
  local high = low + redis.call('ZCOUNT', key, score, score) - 1
  while low <= high do
    local mid = math.floor((low + high) / 2)
    local member = redis.call('ZRANGE', key, mid, mid)[1]
    local at = string.sub(member, 1, 8)
    if at == offset then
      return member
    elseif below(at, offset) then
      low = mid + 1
    else
      high = mid - 1
    end
  end
  return nil
end

-- The member at `offset` due at `due` in the ZSET `key`, in whichever lane it is (nil: none):
-- the normal lane first, where most records wait.
local FIND_SCAN, FIND_LANES = 16, {0, -LANE, LANE}
local function find(key, offset, due)
  for _, base in ipairs(FIND_LANES) do
    local score = int(base + due)
    local some = redis.call('ZRANGEBYSCORE', key, score, score, 'LIMIT', 0, FIND_SCAN)
    for _, member in ipairs(some) do
      if string.sub(member, 1, 8) == offset then
        return member
      end
    end
    if #some == FIND_SCAN then
      local member = find_by_rank(key, score, offset)
      if member then
        return member
      end
    end
  end
  return nil
end

-- Remove the record at `offset` due at `due` from the ZSET `key`; returns whether it was there.
local function take(key, offset, due)
  local member = find(key, offset, due)
  if member then
    redis.call('ZREM', key, member)
  end
  return member
end

-- The member of the record at `offset` due at `due` where it waits whole, the ZSET it waits in
-- (the due index or a wait index) and the wait index's target (nil: neither).
local function find_whole(shard, offset, due)
  local member = find(shard.due, offset, due)
  if member then
    return member, shard.due
  end
  for _, target in ipairs(redis.call('SMEMBERS', shard.waits)) do
    local key = wait_key(shard.waits, target)
    member = find(key, offset, due)
    if member then
      return member, key, target
    end
  end
  return nil
end

-- From here on, the pending bits withdrawals clear (and the references they drop) are written in
-- one go by clear_pending: a batch of cancels clears hundreds, one write per bitmap bucket.
local function defer_clearing()
  clearing = {offsets = {}, refs = {}}
end

-- Clear the pending bit of `offset` in `shard`, now or, while deferred, at clear_pending; a
-- reference (`reference`) also leaves its shard's count of references.
local function unpend(shard, offset, reference)
  if not clearing then
    if reference then
      redis.call('HINCRBY', shard.refs, 'count', -1)
    end
    mark_pending(shard.pending, shard.low, {offset}, false)
    return
  end
  cleared[shard.pending .. offset] = true
  append_grouped(clearing.offsets, {}, shard.pending .. '\0' .. shard.low, offset)
  if reference then
    clearing.refs[shard.refs] = (clearing.refs[shard.refs] or 0) + 1
  end
end

-- Write what defer_clearing held back (nothing when not deferring).
local function clear_pending()
  if not clearing then
    return
  end
  for keys, offsets in pairs(clearing.offsets) do
    local pending, low = string.match(keys, '^(.-)%z(.*)$')
    mark_pending(pending, low, offsets, false)
  end
  for refs, n in pairs(clearing.refs) do
    redis.call('HINCRBY', refs, 'count', -n)
  end
  clearing.offsets, clearing.refs = {}, {}
end

local function withdrawing(first, declared)
  local waits = KEYS[first + 6]
  local refused = undeclared(declared or first + 8, wait_keys(waits))
  if refused then
    return nil, refused
  end
  return {due = KEYS[first], ids = KEYS[first + 1], low = KEYS[first + 2],
          pending = KEYS[first + 3], inflight = KEYS[first + 4], refs = KEYS[first + 5],
          waits = waits, targets = KEYS[first + 7]}
end

local function withdraw_at(shard, offset, due)
  -- Due times run from 2000 on: a due of -1 (known to wait in no index) is not looked for.
  local found = due >= 0 and take(shard.due, offset, due)
  if not found and due >= 0 then
    for _, target in ipairs(redis.call('SMEMBERS', shard.waits)) do
      local key = wait_key(shard.waits, target)
      found = take(key, offset, due)
      if found then
        if redis.call('EXISTS', key) == 0 then
          redis.call('SREM', shard.waits, target)
        end
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
  end
  if found then
    count_members(shard.targets, {found}, -1)
  end
  unpend(shard, offset, not found)  -- not found whole: a reference, never read back now
  return true, false, found or nil
end

-- What the candidate at `offset` due at `due` is: "whole" (with what find_whole gives),
-- "flight", "gone" or "reference".
local function candidate(shard, offset, due)
  local member, key, target = find_whole(shard, offset, due)
  if member then
    return 'whole', member, key, target
  elseif redis.call('ZSCORE', shard.inflight, offset) then
    return 'flight'
  elseif not is_pending(shard.pending, offset) then
    return 'gone'
  end
  return 'reference'
end

local function withdraw(shard, id, hash, vouched, before)
  local candidates = id_candidates(shard.ids, hash)
  if before then
    before(candidates)
  end
  local flight = false
  for _, found in ipairs(candidates) do
    local offset, due = found[1], found[2]
    local kind, member, key, target = candidate(shard, offset, due)
    if kind == 'flight' then
      flight = true
    elseif kind == 'gone' then
      id_drop(shard.ids, hash, offset, true)
    elseif kind == 'whole' and stored_id(member) == id then
      redis.call('ZREM', key, member)
      count_members(shard.targets, {member}, -1)
      if target and redis.call('EXISTS', key) == 0 then
        redis.call('SREM', shard.waits, target)
      end
      unpend(shard, offset, false)
      id_drop(shard.ids, hash, offset)
      return true, offset, due
    elseif kind == 'reference' and vouched[offset] == id then
      withdraw_at(shard, offset, due)
      id_drop(shard.ids, hash, offset)
      return true, offset, due
    end
  end
  return false, nil, nil, flight
end

local function unvouched(shard, hashes, vouched)
  local asked, seen = {}, {}
  for _, hash in ipairs(hashes) do
    for _, found in ipairs(id_candidates(shard.ids, hash)) do
      local offset, due = found[1], found[2]
      if not seen[offset] and vouched[offset] == nil then
        seen[offset] = true
        if candidate(shard, offset, due) == 'reference' then
          asked[#asked + 1] = offset
          asked[#asked + 1] = due
        end
      end
    end
  end
  return asked
end

local function ack(keys, argv, first, now)
  local epoch, n = argv[first], tonumber(argv[first + 1])
  if n == 0 or (redis.call('HGET', keys[6], 'epoch') or '') ~= epoch then
    return 0
  end
  redis.call('HSET', keys[6], 'written', now)
  local offsets = {}
  for i = 1, n do
    offsets[i] = argv[first + 1 + i]
  end
  -- The offsets by target, to forget each group with one HDEL and count what it removed (an
  -- acknowledgement applied again removes nothing, and counts nothing).
  local names, numbers = named_targets(argv, first + n + 3)
  local groups, order = {}, {}
  if #numbers == 0 then  -- not named by the caller: read from the records
    local _, members = call_chunked('HMGET', keys[2], offsets)
    for i, member in ipairs(members) do
      if member then
        append_grouped(groups, order, target_if_any(member) or '', offsets[i])
      end
    end
  else
    for i, offset in ipairs(offsets) do
      append_grouped(groups, order, target_of(names, numbers, i) or '', offset)
    end
  end
  call_chunked('ZREM', keys[1], offsets)
  local removed = 0
  for _, target in ipairs(order) do
    local gone = call_chunked('HDEL', keys[2], groups[target])
    removed = removed + gone
    if gone > 0 and target ~= '' and redis.call('HINCRBY', keys[7], target, -gone) <= 0 then
      redis.call('HDEL', keys[7], target)
    end
  end
  mark_pending(keys[4], keys[3], offsets, false)
  if redis.call('EXISTS', keys[4]) == 0 then
    redis.call('DEL', keys[5])  -- nothing pending: every entry left is stale
    id_states[keys[5]] = nil
  else  -- an acknowledgement applied again (its reply lost) leaves no more entries stale
    local went = math.min(tonumber(argv[first + n + 2]), removed)
    if went > 0 then
      id_went(keys[5], keys[4], went)
      id_flush()
    end
  end
  return removed
end


-- The offset `decimal` (text) as the 8 big-endian bytes a member starts with, and back.
local function offset8(decimal)
  local n = tonumber(decimal)
  local hi = math.floor(n / 4294967296)
  return struct.pack('>I4I4', hi, n - hi * 4294967296)
end

local function decimal_of(offset)
  local hi, lo = struct.unpack('>I4I4', offset)
  return int(hi * 4294967296 + lo)
end

-- The schedule registry of a shard (a HASH, see add.lua's KEYS[11]): "=" and a delay-id ->
-- "<offset>:<ms>" of the record a live schedule is at (":p" after it: paused), or "-<offset>:<ms>"
-- of what ended it; "#schedules" and "#paused" count the live ones. Keyed by the id itself, not
-- its hash: a script finds the schedule of any record it holds (stored_id), and two ids never
-- share an entry. `any`: whether the HASH may hold anything (a shard without schedules reads none
-- of it). Entries read are kept for the script's call.
local function schedule_registry(key, any)
  local reg, seen, stamp = {any = any}, {}, nil
  function reg.get(sid)
    local v = seen[sid]
    if v == nil then
      v = redis.call('HGET', key, '=' .. sid) or false
      seen[sid] = v
    end
    return v
  end
  -- An entry's state: "running", "paused", or nil (none, or ended); and its live offset.
  function reg.state(v)
    if not v or string.sub(v, 1, 1) == '-' then
      return nil
    end
    return string.sub(v, -2) == ':p' and 'paused' or 'running', string.match(v, '^(%d+)')
  end
  -- The schedule `sid` at the record `value` (its offset; "-" first: ended by that record).
  function reg.set(sid, value, paused)
    local was = reg.state(reg.get(sid))
    stamp = stamp or now_ms('')
    value = value .. ':' .. int(stamp) .. (paused and ':p' or '')
    seen[sid] = value
    redis.call('HSET', key, '=' .. sid, value)
    local now = reg.state(value)
    if was ~= now then
      if not was or not now then
        redis.call('HINCRBY', key, '#schedules', was and -1 or 1)
      end
      if was == 'paused' or now == 'paused' then
        redis.call('HINCRBY', key, '#paused', was == 'paused' and -1 or 1)
      end
    end
  end
  -- End the schedule `sid` (nil: none) if it is live at the record at `offset` (8 bytes), by the
  -- record at offset `by` (text): a cancel that found that record waiting, or its occurrence in
  -- flight. Returns whether it did.
  function reg.end_at(sid, offset, by)
    if not any or not sid then
      return false
    end
    local _, at = reg.state(reg.get(sid))
    if at ~= decimal_of(offset) then
      return false
    end
    reg.set(sid, '-' .. by)
    return true
  end
  return reg
end
