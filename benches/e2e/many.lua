-- wrk script: POST the JSON body in $BODY as one of $CONVERSATIONS conversations in
-- turn (each request names its own with x-handoff-conversation-id), so that the
-- connections are many users' conversations, not one conversation's 32 callers.
local file = assert(io.open(os.getenv("BODY"), "rb"))
local body = file:read("*a")
file:close()
local count = tonumber(os.getenv("CONVERSATIONS") or "64")
local requests, turn = {}, 0
function init(args)
  -- Each wrk thread names its own conversations.
  local thread = tostring(math.random(1, 1000000000))
  for i = 1, count do
    requests[i] = wrk.format("POST", nil, {
      ["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer sk-bench",
      ["x-handoff-conversation-id"] = "bench-" .. thread .. "-" .. i,
    }, body)
  end
end
function request()
  turn = turn % count + 1
  return requests[turn]
end
