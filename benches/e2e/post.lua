-- wrk script: POST the JSON body in $BODY, with an optional conversation header.
local file = assert(io.open(os.getenv("BODY"), "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
-- HEADERS: more headers, "name: value" separated by ";" (the Portkey gateway's routing).
for name, value in string.gmatch(os.getenv("HEADERS") or "", "%s*([^:;]+):%s*([^;]+)") do
  wrk.headers[name] = value
end
local conversation = os.getenv("CONVERSATION")
if conversation and conversation ~= "" then
  wrk.headers["x-handoff-conversation-id"] = conversation
end
