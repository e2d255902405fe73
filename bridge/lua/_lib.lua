--[[
_lib: prepended to every script by bridge.store when it registers them (not a script itself).

now_ms(given): the time as epoch milliseconds: `given` when a test passes one, else Redis TIME,
so every replica reads one clock whatever its own says.

each_chunk(list, width, fn): call fn(first, last) over `list` in slices of at most `width`
items, so one variadic command takes many arguments without passing Lua's unpack limit.
]]
local function now_ms(given)
  if given ~= nil and given ~= '' then
    return tonumber(given)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local CHUNK = 1000

-- redis.call(command, key, <items of list>), in slices of CHUNK items (CHUNK is even, so
-- score/member and field/value pairs never split); returns the replies summed when they are
-- integers, else concatenated.
local function call_chunked(command, key, list)
  local total, joined = 0, {}
  for first = 1, #list, CHUNK do
    local reply = redis.call(command, key, unpack(list, first, math.min(first + CHUNK - 1, #list)))
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
