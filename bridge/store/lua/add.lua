--[[
add: apply a batch of one shard's delay-topic records in offset order — schedules, replacements
and cancels — and advance its ingest watermark, atomically.

A scheduled record is one member of the due index: its offset as 8 big-endian bytes, then the
encoded record, scored by its due time in its priority's lane (see LANES in _lib.lua) — so records
due at the same time with the same priority sort in offset order, and a record costs Redis one
entry. A record with a caller-given delay-id is also named in the id index (its offset and due ms,
under a hash of the id: see the id index in _lib.lua), and only such a record: a later record with the
same id replaces it while it waits, and a cancel (no due time) withdraws it. A record already
claimed is past both: the replacement is simply scheduled, the cancel finds nothing.

A record due further out than store.payload_horizon comes as a reference instead: its offset and
due ms (16 bytes), which go to a chunk of its time bucket (due ms rounded down to ARGV[3]) in the
references HASH, listed in the chunk index by the bucket's start, until the read-back stores the
record whole (promote.lua). A reference is pending like a record; a cancel or a replacement that
finds its record neither waiting nor in flight but pending has found a reference: it clears the
bit, and the read-back skips the reference.

A record whose offset is at or below the watermark was applied before (and may since have been
delivered and removed), so it is skipped: reading the same delay-topic record twice applies it
once, and re-reading a partition from an earlier offset gives the same final state.

The caller passes the watermark it last saw for the shard. If the shard's state is gone, or its
watermark is below that, Redis lost writes (data wiped, or a restart from an AOF missing its last
second): nothing is written and the caller re-reads the delay topic from a point Redis still
covers (see bridge.ingress).

KEYS[1]  due index      ZSET  member -> score (due ms in its lane)
KEYS[2]  meta           HASH  field "ingested" -> highest offset handled, "written" -> when it
                              moved on (epoch ms, Redis's clock; acknowledgements too: see ack
                              in _lib.lua)
                              "floor" -> the lowest offset this state applied (set once),
                              "copied" and an offset below it -> the exact replacement of that
                              record this state stored (see ARGV[6 + 2V]),
                              ("withdrawing": earlier code's KEYS[13], moved there)
KEYS[3]  low index      ZSET  offset bucket -> 0 (see _lib.lua, mark_pending)
KEYS[4]  pending        HASH  offset bucket -> bitmap of its pending offsets
KEYS[5]  id index       HASH  buckets of entries: id hash, offset, due ms (see _lib.lua)
KEYS[6]  in-flight      ZSET  offset -> lease deadline ms
KEYS[7]  references     HASH  chunk -> references (16 bytes each); "count" -> references waiting,
                              "seq" -> chunks named so far
KEYS[8]  chunk index    ZSET  chunk -> its bucket's start ms
KEYS[9]  waits          SET   targets with a wait index (see wait_key in _lib.lua): a cancel or
                              a replacement reaches a record waiting for its target's rate there
KEYS[10] targets       HASH  target -> records held whole (see the targets HASH in _lib.lua)
KEYS[11] schedules     HASH  the schedule registry: "=" and a delay-id -> "<offset>:<ms>" of the record a
                              recurring schedule with that id is at (":p" after it: paused), or
                              "-<offset>:<ms>" of the cancel or record that ended it (ms: when it
                              was written) (see schedule_registry in _lib.lua)
KEYS[12] claimed       HASH  offset -> member of the records in flight
KEYS[13] withdrawing   ZSET  "<offset>:<k>" (the k-th entry at that offset) -> the offset: entries
                              not yet looked for in other partitions
KEYS[14..] the wait indexes the SET lists (see undeclared in _lib.lua)
ARGV[1]  the watermark the caller expects, or "" when it knows none
ARGV[2]  highest offset of the batch, including records sent to the DLQ instead of stored
ARGV[3]  the width of a reference time bucket in ms (where a reference is appended, and where
          a cancel's due-time hint looks for one)
ARGV[4]  the shard's promotions (references field "promoted") the caller read before it looked
          for the records default delay-ids name, "" when it looked for none in Redis: when
          the count moved, a `where` saying "in no index" may miss a reference promoted whole
          since, and the script answers {"again"}, writing nothing
ARGV[5]  V, then V pairs: an offset (8 bytes) and the delay-id the caller read there in the
          delay topic ("": another record's or none) — the references it vouches for (see
          withdraw in _lib.lua): those of this batch with a caller-given id, and those this
          script asked for
ARGV[6 + 2V] W, then W triples: the offset of a record of this batch whose caller-given delay-id
          is a default id of this shard (`<topic>:<partition>:<offset>`, not in the id index), or
          that names the record it replaces exactly (`delay-replaces`), a `where` naming that
          record (it replaces it as a cancel of that id would withdraw it), and "1" for the exact
          one ("" else): that record only, and nothing when this shard's state knows it no longer
          waits (claimed, or settled since the state's floor: see below); when the state cannot
          know (an offset below its floor), the first such replacement of it is one by its
          delay-id as any other, and a later one nothing (meta "copied" and its offset)
ARGV[7 + 2V + 3W] flags: "a" when the topic has other partitions: each entry that finds nothing
          here is kept in KEYS[13] until the caller, having looked for it there, removes it; an
          entry at or below the watermark still kept there is reported
          again. "r" and an offset when the shard is read again after Redis lost its state, up
          to that offset (where the partition ended then), kept in meta "reread" until the
          watermark passes it, whoever reads the shard next: below it, a cancel by its
          delay-id that finds nothing, of a schedule the registry has no word of, ends it there
          all the same (the registry says "-" and its offset) — the journal may have left the
          schedule's record out, and a record carrying it on from before the cancel may follow
ARGV[8 + 2V + 3W] T, then T target names, then 2 bytes per group below: the number of its
          record's target among them, 0 for a cancel and a reference (see named_targets in
          _lib.lua): each record stored whole counts in the targets HASH
ARGV[9 + 2V + 3W + T] R, then R triples: the offset of a recurring schedule of this batch, the
          offset of the record of this shard it carries on from (its delay-continues), "" for
          one a producer wrote, and "1" when it says it was paused when written (its
          delay-paused: what a registry that has no word of it goes by). A producer's schedule is stored as any record with its delay-id
          and registered at its offset. One the bridge wrote (from the record it continues, as
          its occurrence was delivered) is stored only while the registry has the schedule at
          that record, or has no word of it (a state rebuilt, or made before the registry), and
          withdraws nothing: the record it continues may wait again for its own occurrence's
          retry. Any other record or cancel with the id of a registered schedule, or naming its
          record by its default id (waiting or in flight), ends it there
          (the registry says "-" and its offset): whatever the egress wrote from before it is
          not stored, so a cancel read while the schedule's occurrence was in flight, or before
          the record carrying it on was read, still ends it; the record the schedule was at is
          then among those withdrawn (due -1), for the journal, so that a rebuild that does not
          read the cancel again ends it there too. A pause or a resume (an entry like
          a cancel's, its `where` "p" or "r") marks a registered schedule paused or not, and is
          nothing else: the egress skips a paused schedule's occurrences and carries it on. The
          end of a schedule (`where` "e", its record in the triples above with the record it
          ends at) ends it there as a cancel would, and withdraws nothing. A schedule's record
          a re-read left out, its step delivered (`where` "s", in the triples above as a
          producer's): the registry has the schedule there unless it has word of it at or past
          that record; nothing is stored or withdrawn. One left out as cancelled (`where`
          "x"; or delivered and its schedule ended there by a cancel read while the record
          carrying it on was not): the schedule ends there, unless the registry has word of it
          past that record.
          The registry counts its live schedules in field "#schedules", of which "#paused"
          paused.
ARGV[10 + 2V + 3W + T + 3R..] groups of five, offsets ascending (several cancels may share one): offset, score, member, delay-id, id hash — the
          delay-id and its hash "" unless the caller gave one; a cancel is offset, "", where,
          delay-id, id hash — `where` "" but for a default delay-id of this shard (not in the id
          index): then a `where` (_lib.lua) naming its record (its due ms -1 when it waits in no
          index); a reference's member is its 16 bytes (a record's member is longer) and its
          score its due ms (its priority is read with the record)

Returns: {0, records added, replaced, cancelled, cancels that found nothing (and exact
          replacements that came after their record left: see ARGV[6 + 2V]), U, then U places in
          the batch (the entry's, from 0: a record with several cancels is an entry each, at
          one offset) of each cancel that found nothing and each record with a caller-given id
          that replaced nothing here (the caller looks for theirs in the topic's other
          partitions; -1 - the place where a record with its id, or the one its default id
          names, was in flight: claimed, and perhaps put back or claimed ahead and not sent), E, then E pairs for the records carrying a schedule on that were not
          stored (see ARGV[9 + 2V + 3W + T]): the place in the batch, and the offset of what
          ended the schedule, "-" first when it was a cancel or a one-shot record, then quadruples for each record withdrawn: its offset (8 bytes), its due
          ms (-1: a reference), the place of the cancel or replacement that withdrew it and, when
          that named it by its default id, the delay-id of its own ("" when it has none, or was
          named by it) (the journal's cancelled and replaced entries)}
       | {1, -1} shard state missing | {2, watermark} watermark went back
       | {"undeclared", wait indexes...}
       | {"again"} see ARGV[4]
       | {"confirm", then pairs: offset, due ms} references the id index gives as candidates for
         an id of the batch that the caller did not vouch for, and references a default id of
         the batch names (their own delay-ids end their schedules and name them in the
         journal): nothing was written; the caller reads them in the delay topic and calls again
]]
local refused = undeclared(14, wait_keys(KEYS[9]))
if refused then
  return refused
end
local mark, pending_across, reread_to = unpack(redis.call('HMGET', KEYS[2], 'ingested',
  'withdrawing', 'reread'))
if ARGV[1] ~= '' then
  if not mark then
    return {1, -1}
  end
  if tonumber(mark) < tonumber(ARGV[1]) then
    return {2, tonumber(mark)}
  end
end

-- 1,023 references: with its 6 bytes of header a full chunk is 16,374 bytes, inside jemalloc's
-- 16 KiB size class (1,024 would take the 20 KiB one).
local REFERENCE, CHUNK_BYTES = 16, 16 * 1023
local buckets, bucket_starts = {}, {}
local width = tonumber(ARGV[3])
local function refer(due_ms, pair)
  local start = tonumber(due_ms)
  append_grouped(buckets, bucket_starts, start - start % width, pair)
end

-- Append the batch's references to the open chunk of their bucket (field "<start>"); a chunk
-- that reaches CHUNK_BYTES is renamed "<start>.<seq>" and a new one opened, so a chunk is read
-- back and promoted in one go whatever the bucket holds.
local function append_references()
  for _, start in ipairs(bucket_starts) do
    local field = string.format('%d', start)
    local open = (redis.call('HGET', KEYS[7], field) or '') .. table.concat(buckets[start])
    while #open > CHUNK_BYTES do
      local name = field .. '.' .. redis.call('HINCRBY', KEYS[7], 'seq', 1)
      redis.call('HSET', KEYS[7], name, string.sub(open, 1, CHUNK_BYTES))
      redis.call('ZADD', KEYS[8], start, name)
      open = string.sub(open, CHUNK_BYTES + 1)
    end
    redis.call('HSET', KEYS[7], field, open)
    redis.call('ZADD', KEYS[8], start, field)
  end
end

local shard = {due = KEYS[1], ids = KEYS[5], low = KEYS[3], pending = KEYS[4],
               inflight = KEYS[6], refs = KEYS[7], waits = KEYS[9], targets = KEYS[10]}
local watermark = tonumber(mark or '-1')
if ARGV[4] ~= '' and (redis.call('HGET', KEYS[7], 'promoted') or '0') ~= ARGV[4] then
  return {'again'}  -- a reference promoted since the caller looked for what default ids name
end
local vouched, replacing = {}, 6 + 2 * tonumber(ARGV[5])
for i = 6, replacing - 1, 2 do
  vouched[ARGV[i]] = ARGV[i + 1]
end
local replaces, exactly, at_across = {}, {}, replacing + 1 + 3 * tonumber(ARGV[replacing])
for i = replacing + 1, at_across - 1, 3 do
  replaces[ARGV[i]] = ARGV[i + 1]
  exactly[ARGV[i]] = ARGV[i + 2] == '1'
end
local across = string.find(ARGV[at_across], 'a', 1, true) ~= nil
local reread_end = tonumber(string.match(ARGV[at_across], 'r(%d+)') or '')
if reread_end and reread_end > tonumber(reread_to or '-1') then
  redis.call('HSET', KEYS[2], 'reread', reread_end)
  reread_to = reread_end
end
reread_to = tonumber(reread_to or '-1')
if reread_to >= 0 and tonumber(ARGV[2]) + 1 >= reread_to then
  redis.call('HDEL', KEYS[2], 'reread')  -- this batch reaches the end: read live from here on
end
local target_names, target_numbers, at_recurring = named_targets(ARGV, at_across + 1)
local recurring, paused_as, first = {}, {}, at_recurring + 1 + 3 * tonumber(ARGV[at_recurring])
for i = at_recurring + 1, first - 1, 3 do
  recurring[ARGV[i]] = ARGV[i + 1]
  paused_as[ARGV[i]] = ARGV[i + 2] == '1'
end

-- The schedule registry (KEYS[11]), read only when it holds something or this batch adds to it:
-- a deployment without recurring schedules pays one EXISTS a call.
local registry_any = at_recurring + 1 < first or redis.call('EXISTS', KEYS[11]) == 1
local reg = schedule_registry(KEYS[11], registry_any)
local registry, register = reg.get, reg.set
-- Whether the registry has the schedule paused (nil: it has no word of it, or it ended).
local function paused_in(sid)
  local state = reg.state(registry(sid))
  if state then
    return state == 'paused'
  end
  return nil
end
-- The delay-id its producer gave the record at `offset` (8 bytes) that a default id named: from
-- the member withdrawn (`took`), the one in flight, or a reference's as the caller read it in the
-- delay topic (nil: none).
local function own_id(offset, took)
  local member = took or (registry_any and redis.call('HGET', KEYS[12], offset))
  if member then
    return stored_id(member)
  end
  local read = vouched[offset]  -- a reference's, read in the delay topic (see `located`)
  return read ~= nil and read ~= '' and read or nil
end
-- A pause or a resume: the schedule's flag, where the registry has it live.
local function hold(sid, paused)
  local _, at = reg.state(registry_any and registry(sid))
  if at then
    register(sid, at, paused)
  end
end
local ended = {}
-- Whether a record carrying the schedule `sid` names on from `from` comes too late: its schedule
-- ended, or moved to another record, since (noted in `ended` with what did it).
local function superseded(sid, from, place)
  local v = registry(sid)
  if not v then
    return false  -- no word of it: a rebuilt state, or one made before the registry
  end
  local at = string.match(v, '^(%-?%d+)')
  if at == from then
    return false
  end
  -- A live entry at a record before the one it continues: the registry is behind the schedule
  -- (Redis lost its last writes and the delay topic is read again from the committed offset).
  -- A cancel or a record with its id read since is read again after this one, or was settled
  -- by the journal; what moved the schedule on, the registry would be at or past this record.
  -- An end before it: a schedule with the id produced after that end, whose record the registry
  -- never saw (a rebuild left it out, the journal holding its occurrence delivered).
  if tonumber((string.gsub(at, '^%-', ''))) < tonumber(from) then
    return false
  end
  ended[#ended + 1] = place
  ended[#ended + 1] = at
  return true
end

-- What calls before this one left to look for in the topic's other partitions (KEYS[13]:
-- "<offset>:<k>" of the k-th entry at that offset, from 0, scored by the offset): kept until the
-- caller looked there, whatever happens in between; the offset to commit (low.lua) and to resume
-- reading from stay at or below them. Each call reads only the entries it asks about and adds
-- its own (one string of them all, read and written whole, made a catch-up quadratic). Earlier
-- code kept them in meta "withdrawing": moved here.
if pending_across then
  local moved = {}
  for token in string.gmatch(pending_across, '%S+') do
    moved[#moved + 1] = string.match(token, '^(%d+):')
    moved[#moved + 1] = token
  end
  call_chunked('ZADD', KEYS[13], moved)
  redis.call('HDEL', KEYS[2], 'withdrawing')
end
local left_any = redis.call('EXISTS', KEYS[13]) == 1
local kept_now = {}  -- score, member pairs: what this call keeps to look for elsewhere
local hashes = {}
for i = first, #ARGV, 5 do
  if ARGV[i + 4] ~= '' and tonumber(ARGV[i]) > watermark then
    hashes[#hashes + 1] = ARGV[i + 4]
    if ARGV[i + 1] ~= '' and tonumber(ARGV[i]) >= 2 ^ 48 then  -- before anything is written
      error('offset beyond the id index (2^48): ' .. ARGV[i])
    end
  end
end
id_prefetch(KEYS[5], hashes)
-- Only a shard holding references can hold a candidate this script cannot confirm itself.
if #hashes > 0 and redis.call('ZCARD', KEYS[8]) > 0 then
  local asked = unvouched(shard, hashes, vouched)
  if #asked > 0 then
    table.insert(asked, 1, 'confirm')
    return asked
  end
end

-- The references of the time bucket starting at `start`, to look one up: its chunks' fields in
-- the order adds filled them (the open one, "<start>", last: a full chunk was renamed
-- "<start>.<seq>"), so in offset order, and the chunks read so far.
local in_buckets = {}
local function bucket_chunks(start)
  local bucket = in_buckets[start]
  if not bucket then
    local fields, seq = redis.call('ZRANGEBYSCORE', KEYS[8], start, start), {}
    for _, field in ipairs(fields) do
      seq[field] = tonumber(string.match(field, '%.(%d+)$')) or math.huge
    end
    table.sort(fields, function(a, b) return seq[a] < seq[b] end)
    bucket = {fields = fields, read = {}}
    in_buckets[start] = bucket
  end
  return bucket
end

local function chunk_at(bucket, i)
  local chunk = bucket.read[i]
  if not chunk then
    chunk = redis.call('HGET', KEYS[7], bucket.fields[i]) or ''
    bucket.read[i] = chunk
  end
  return chunk
end

-- The offset of the `n`th reference (from 0) of a chunk, as a number (offsets are below 2^53).
local function offset_in(chunk, n)
  local high, low = struct.unpack('>I4I4', chunk, n * REFERENCE + 1)
  return high * 4294967296 + low
end

-- The last index from `low` to `high` whose key (`key(i)`, ascending) is at most `wanted`, nil
-- for none: a binary search that probes the indexes `guess` and then `guess + 1` first (a right
-- guess ends it in two probes).
local function last_at_most(low, high, wanted, key, guess)
  local found, try = nil, guess
  while low <= high do
    local mid = (try and try >= low and try <= high) and try or math.floor((low + high) / 2)
    try = try and try == guess and guess + 1 or nil
    if key(mid) <= wanted then
      found, low = mid, mid + 1
    else
      high = mid - 1
    end
  end
  return found
end

-- Whether the record at `offset` (8 bytes) is a reference of the time bucket of `due` (a
-- reference stays one until promote.lua drops it from its chunk and stores it whole): the last
-- chunk of the bucket starting at or below the offset, then the offset in it, by binary search.
-- Adds append in offset order; were that not so, a reference would be missed, never one made
-- up: the caller would look for its record instead (see `located`). A bulk cancel names
-- references in offset order, so the chunk of the last lookup is tried first, and in a chunk
-- the place the offset would have were its references' offsets consecutive.
local function referenced(offset, due)
  if not width then
    return false
  end
  local bucket = bucket_chunks(due - due % width)
  local wanted = offset_in(offset, 0)
  local at = last_at_most(1, #bucket.fields, wanted, function(i)
    local chunk = chunk_at(bucket, i)
    return #chunk >= REFERENCE and offset_in(chunk, 0) or math.huge
  end, bucket.last)
  bucket.last = at
  local chunk = at and chunk_at(bucket, at) or ''
  if #chunk < REFERENCE then
    return false
  end
  local function key(n)
    return offset_in(chunk, n)
  end
  local n = last_at_most(0, #chunk / REFERENCE - 1, wanted, key, wanted - key(0))
  return n ~= nil and key(n) == wanted
end

-- A `where` with a due time that the caller did not look up is a hint (the due time a cancel
-- gave for its record), checked before anything is written: the record is a reference in the
-- time bucket of that time (the `where` becomes "in no index", as withdraw_at takes a
-- reference), or waits whole at it, or is in flight or gone (withdraw_at finds so whatever the
-- due time). Otherwise the hint is wrong: the caller looks for those records ({"locate",
-- offsets}) and calls again with where they wait. Nothing an add does turns a reference whole,
-- so an answer holds for the whole batch.
-- A reference so named has its own delay-id read in the delay topic first (asked as a candidate
-- is: {"confirm", ...}): it ends its schedule (own_id), and the journal names it by it.
local located, locate, own_asked = {}, {}, {}
local function ask_own(offset, at)
  if vouched[offset] == nil then
    own_asked[#own_asked + 1] = offset
    own_asked[#own_asked + 1] = at
  end
end
local function check(hint)
  local offset, at = read_where(hint)
  if located[hint] then
    return
  elseif at < 0 then  -- in no index: a reference (its due time unknown: -1 reads any record), or gone
    located[hint] = hint
    if vouched[offset] == nil and is_pending(shard.pending, offset)
        and not redis.call('ZSCORE', shard.inflight, offset) then
      ask_own(offset, -1)
    end
  elseif referenced(offset, at) then
    located[hint] = where(offset, -1)
    ask_own(offset, at)
  else
    located[hint] = hint
    if candidate(shard, offset, at) == 'reference' then  -- pending, yet not where it says
      locate[#locate + 1] = offset
    end
  end
end
for i = first, #ARGV, 5 do
  if tonumber(ARGV[i]) > watermark then
    if ARGV[i + 1] == '' and #ARGV[i + 2] > 1 then  -- not a pause, resume or end (p, r, e)
      check(ARGV[i + 2])
    elseif replaces[ARGV[i]] then
      check(replaces[ARGV[i]])
    end
  end
end
-- Asked first: the hints located (by a pass over the shard's records) hold for the next round,
-- the own delay-ids vouched for do too, and a pass is made once.
if #own_asked > 0 then
  table.insert(own_asked, 1, 'confirm')
  return own_asked
end
if #locate > 0 then
  table.insert(locate, 1, 'locate')
  return locate
end

defer_clearing()
local due, members = {}, {}
local added, plain, replaced, cancelled, missing, referred = 0, 0, 0, 0, 0, 0
local unmatched, withdrawn = {}, {}
-- The lowest offset this state of the shard applied (meta "floor", set when the state is made):
-- an offset from there up to a record's own that is neither pending nor in flight was settled
-- (delivered, cancelled, replaced, expired or dead-lettered).
local floor  -- read when first needed (false: a state made before floors)
if not mark then  -- a new state: what it applies starts at its first record (or after the batch)
  floor = first <= #ARGV and tonumber(ARGV[first]) or tonumber(ARGV[2]) + 1
end
local function settled_before(offset, own)
  if floor == nil then
    floor = tonumber(redis.call('HGET', KEYS[2], 'floor') or '') or false
  end
  local hi, lo = struct.unpack('>I4I4', offset)
  local n = hi * 4294967296 + lo
  return floor and n >= floor and n < tonumber(own)
end
-- An exact replacement of a record below the floor, which this state cannot know: the first one
-- read stands for the replacement the record had, as a replacement by its id, and is noted in
-- meta ("copied" and the record's offset); a later one of the same record came after that one
-- took it (or after it left), and is nothing. Copies of one record made by operators who each
-- saw it waiting were each stored after a rebuild that started past it, and each delivered.
local function taken_before(offset, own)
  local field = 'copied' .. offset
  local first = redis.call('HGET', KEYS[2], field)
  if first then
    return first ~= own
  end
  redis.call('HSET', KEYS[2], field, own)
  return false
end
local function withdrew(offset, due, by, by_default, member)
  withdrawn[#withdrawn + 1] = offset
  withdrawn[#withdrawn + 1] = due
  withdrawn[#withdrawn + 1] = by
  -- Named by its default id: the delay-id of its own, if it has one (the journal names it so):
  -- a reference's as the caller read it in the delay topic (see `located`).
  local own = ''
  if by_default then
    own = member and (stored_id(member) or '') or vouched[offset] or ''
  end
  withdrawn[#withdrawn + 1] = own
end

-- The schedule `sid` ends by the entry at `place`: live at a record that entry did not withdraw
-- (`took`: the offset it withdrew, or false) — in flight, or its occurrence acknowledged and the
-- record carrying it on not read yet — the end is journaled as that record's withdrawal, so a
-- rebuild that does not read the entry again (the commit passed it) ends the schedule there too.
local function journal_end(sid, took, place)
  local _, live = reg.state(registry(sid))
  if live and offset8(live) ~= took then
    withdrew(offset8(live), -1, place, false, nil)
  end
end

-- Each record stored whole counts for its target (written with the records, by flush: one
-- HINCRBY a target).
local stored_by = new_counts()
-- A record the caller named no target for has its read from the record.
local function stored_whole(place, member)
  local target = target_of(target_names, target_numbers, place + 1) or target_if_any(member)
  if target then
    tally(stored_by, target, 1)
  end
end

-- Write the records held back so far (see below).
local held = {}  -- their offsets
local function flush()
  write_counts(KEYS[10], stored_by)  -- before a withdrawal of one of them takes it away
  call_chunked('ZADD', KEYS[1], due)
  mark_pending(KEYS[4], KEYS[3], members, true)
  if referred > 0 then
    redis.call('HINCRBY', KEYS[7], 'count', referred)
  end
  due, members, referred, held = {}, {}, 0, {}
end

-- Before the id index's candidates for an id are looked at: written, if one is held back.
local function written(candidates)
  for _, found in ipairs(candidates) do
    if held[found[1]] then
      flush()
      return
    end
  end
end

-- The entry at ARGV[i] as meta "withdrawing" names it: its offset, and which of the entries at
-- that offset it is (token_k, kept by the loop below).
local token_offset, token_k = nil, 0
local function token(i)
  return ARGV[i] .. ':' .. token_k
end

-- The entry at ARGV[i] found nothing here: the caller looks in the topic's other partitions
-- (`flew`: a record with its id was in flight, its place is given as -1 - place).
local function unmatch(i, place, flew)
  unmatched[#unmatched + 1] = flew and -1 - place or place
  if across then
    kept_now[#kept_now + 1] = ARGV[i]
    kept_now[#kept_now + 1] = token(i)
  end
end

for i = first, #ARGV, 5 do
  if ARGV[i] == token_offset then
    token_k = token_k + 1
  else
    token_offset, token_k = ARGV[i], 0
  end
  if tonumber(ARGV[i]) <= watermark then
    if left_any and redis.call('ZSCORE', KEYS[13], token(i)) then  -- not looked for elsewhere
      unmatched[#unmatched + 1] = (i - first) / 5
      if ARGV[i + 1] == '' then
        missing = missing + 1
      end
    end
  else
    local score, member, id, hash = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
    local place = (i - first) / 5  -- in the batch, from 0
    if score == '' and (member == 'p' or member == 'r') then
      if id ~= '' then
        hold(id, member == 'p')
      end
    elseif score == '' and member == 's' then
      -- A schedule's record a re-read left out, its step delivered (the journal says so): the
      -- record carrying it on or ending it follows, so the schedule is here, as the registry had
      -- it before Redis lost it — unless the registry has word of it at or past this record.
      local v = id ~= '' and registry(id)
      local at = v and tonumber((string.gsub(string.match(v, '^(%-?%d+)'), '^%-', '')))
      if id ~= '' and (not at or at < tonumber(ARGV[i])) then
        register(id, ARGV[i], paused_as[ARGV[i]])
      end
    elseif score == '' and member == 'x' then
      -- The same, its record cancelled (the journal says so; or its schedule ended there: its
      -- occurrence in flight or delivered when a cancel came): the schedule went no further. It
      -- ends here unless the registry has word of it past this record.
      local v = id ~= '' and registry(id)
      local at = v and tonumber((string.gsub(string.match(v, '^(%-?%d+)'), '^%-', '')))
      if id ~= '' and (not at or at <= tonumber(ARGV[i])) then
        register(id, '-' .. ARGV[i])
      end
    elseif score == '' and member == 'e' then
      -- The end of a schedule at the record it continues (its last occurrence delivered).
      local v = id ~= '' and registry_any and registry(id)
      if v and string.match(v, '^(%-?%d+)') == recurring[ARGV[i]] then
        register(id, '-' .. ARGV[i])
      end
    elseif score == '' then
      local done, offset, at, flew = withdraw(shard, id, hash, vouched, written)
      local by_default, took, flight = false, nil, false
      if not done and member ~= '' then  -- a default id: where the caller found its record
        flush()  -- it may be one of this batch's
        offset, at = read_where(located[member])
        done, flight, took = withdraw_at(shard, offset, at)
        by_default = true
        -- A schedule's record: the schedule ends (journaled as that record's withdrawal when it
        -- is in flight: see below).
        if (done or flight) and reg.end_at(own_id(offset, took), offset, ARGV[i]) and not done then
          withdrew(offset, at, place, by_default, took)
        end
      end
      if done then
        withdrew(offset, at, place, by_default, took)
        cancelled = cancelled + 1
      else
        missing = missing + 1
        unmatch(i, place, flew or flight)
      end
      if registry_any and id ~= '' and registry(id) then
        journal_end(id, done and offset, place)
        register(id, '-' .. ARGV[i])
      elseif tonumber(ARGV[i]) < reread_to and not done and member == '' and id ~= '' then
        -- No word of it in a state read again: a schedule's record the journal left out (its
        -- occurrence delivered) may be carried on by a record after this cancel.
        register(id, '-' .. ARGV[i])
        registry_any = true
      end
    elseif id == '' then
      -- No caller-given id, so only a cancel of its default id can withdraw it: held back and
      -- written in one go (at the end, or before such a cancel). A record with an id is held
      -- back too, until the id index offers it to a later record of the batch (`written`).
      if #member == REFERENCE then
        refer(score, member)
        referred = referred + 1
      else
        due[#due + 1] = score
        due[#due + 1] = member
        stored_whole(place, member)
      end
      members[#members + 1] = member
      plain = plain + 1
    elseif recurring[ARGV[i]] and recurring[ARGV[i]] ~= ''
        and (not registry_any or not superseded(id, recurring[ARGV[i]], place)) then
      -- Carrying its schedule on: stored beside whatever waits (see ARGV[9 + 2V + 3W + T]).
      if #member == REFERENCE then
        refer(score, member)
        referred = referred + 1
      else
        due[#due + 1] = score
        due[#due + 1] = member
        stored_whole(place, member)
      end
      members[#members + 1] = member
      held[string.sub(member, 1, 8)] = true
      id_put(KEYS[5], hash, string.sub(member, 1, 8), due_of(score))
      local paused = paused_in(id)
      if paused == nil then
        paused = paused_as[ARGV[i]]
      end
      register(id, ARGV[i], paused)
      added = added + 1
    elseif recurring[ARGV[i]] and recurring[ARGV[i]] ~= '' then
      -- Its schedule ended or moved on (noted by superseded): nothing of it is written.
    else
      local exact = exactly[ARGV[i]]  -- that record only, and only while it waits
      local done, offset, at, by_default, took, flight = false, nil, nil, false, nil, false
      local flew = false
      if not exact then
        done, offset, at, flew = withdraw(shard, id, hash, vouched, written)
      end
      if not done and replaces[ARGV[i]] then  -- where the caller found the record it names
        flush()  -- it may be one of this batch's
        offset, at = read_where(located[replaces[ARGV[i]]])
        done, flight, took = withdraw_at(shard, offset, at)
        by_default = true
        if done or (flight and not exact) then  -- a schedule's record: the schedule ends
          reg.end_at(own_id(offset, took), offset, ARGV[i])
        end
      end
      local late = exact and not done and (flight or settled_before(offset, ARGV[i]))
      if exact and not done and not late then  -- this state cannot know: the first stands
        late = taken_before(offset, ARGV[i])
      end
      if exact and not done and not late then  -- by its id
        done, offset, at, flew = withdraw(shard, id, hash, vouched, written)
        by_default = false
      end
      if late then
        missing = missing + 1  -- its record left before it came: nothing of it is written
      else
        if done then
          withdrew(offset, at, place, by_default, took)
          replaced = replaced + 1
        else
          unmatch(i, place, flew or (flight and not exact))
        end
        if #member == REFERENCE then
          refer(score, member)
          referred = referred + 1
        else
          due[#due + 1] = score
          due[#due + 1] = member
          stored_whole(place, member)
        end
        members[#members + 1] = member
        held[string.sub(member, 1, 8)] = true
        id_put(KEYS[5], hash, string.sub(member, 1, 8), due_of(score))
        added = added + 1
        if registry_any then
          journal_end(id, done and offset, place)
        end
        if recurring[ARGV[i]] then  -- a producer's schedule: registered here
          register(id, ARGV[i])
        elseif registry_any and registry(id) then  -- a one-shot record ends the schedule
          register(id, '-' .. ARGV[i])
        end
      end
    end
  end
end
flush()
clear_pending()
append_references()
id_flush()
if tonumber(ARGV[2]) > watermark then
  redis.call('HSET', KEYS[2], 'ingested', ARGV[2], 'written', now_ms(''))
end
if not mark then
  redis.call('HSET', KEYS[2], 'floor', floor)
end
call_chunked('ZADD', KEYS[13], kept_now)
local reply = {0, added + plain, replaced, cancelled, missing, #unmatched}
for _, x in ipairs(unmatched) do
  reply[#reply + 1] = x
end
reply[#reply + 1] = #ended / 2
for _, list in ipairs({ended, withdrawn}) do
  for _, x in ipairs(list) do
    reply[#reply + 1] = x
  end
end
return reply
