-- wrk script: every request opens a new conversation, so every request appends to the
-- store (the write path), unlike the repeated bodies of post.lua.
local n = 0
local seed = math.random(1, 1000000000)
request = function()
  n = n + 1
  local body = '{"model":"bench-model","messages":[{"role":"user","content":"append ' .. seed .. '-' .. n .. '"}]}'
  return wrk.format("POST", "/v1/chat/completions", {["Content-Type"] = "application/json"}, body)
end
