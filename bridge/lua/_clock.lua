--[[
_clock: prepended to every script by bridge.store when it registers them (not a script itself).

now_ms(given): the time as epoch milliseconds: `given` when a test passes one, else Redis TIME,
so every replica reads one clock whatever its own says.
]]
local function now_ms(given)
  if given ~= nil and given ~= '' then
    return tonumber(given)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
