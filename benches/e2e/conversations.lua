-- wrk script: small chats spread over $COUNT distinct conversations, to fill the tracker.
local count = tonumber(os.getenv("COUNT") or "10000")
local n = 0
request = function()
  n = n + 1
  local id = string.format("bench-%d-%d", math.random(1, 1000000000), n % count)
  local body = '{"model":"bench-model","messages":[{"role":"user","content":"conversation ' .. (n % count) .. '"}]}'
  return wrk.format("POST", "/v1/chat/completions",
    {["Content-Type"] = "application/json", ["x-handoff-conversation-id"] = "c" .. (n % count)}, body)
end
