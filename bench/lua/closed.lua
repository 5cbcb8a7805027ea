-- Closed-loop load for wrk: each connection sends its next request as soon as the
-- previous answer arrives. Bodies are taken in turn from a pool of varied raw
-- transactions (one JSON document per line), so the API parses and scores different
-- inputs, not one cached body.
--
--   wrk -t1 -c32 -d10s --latency -s closed.lua http://127.0.0.1:8000/v1/fraud/score -- pool.jsonl
--
-- Latency printed by wrk here is closed-loop latency: it hides queueing the server
-- caused (coordinated omission). Only the throughput of this run is used; latency
-- percentiles come from paced.lua.

local bodies = {}
local next_body = 1

function init(args)
  local path = args[1]
  for line in io.lines(path) do
    if #line > 0 then bodies[#bodies + 1] = line end
  end
  assert(#bodies > 0, "empty body pool: " .. tostring(path))
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  local body = bodies[next_body]
  next_body = next_body % #bodies + 1
  return wrk.format(nil, nil, nil, body)
end
