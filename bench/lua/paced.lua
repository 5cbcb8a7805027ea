-- Open-loop (fixed-rate) load for wrk, with latency measured from the intended send
-- time, i.e. without coordinated omission. wrk2 is not packaged here; this gives wrk
-- the part of wrk2 that matters.
--
--   BENCH_LATENCY_FILE=lat.txt wrk -t1 -c64 -d10s -s paced.lua URL -- pool.jsonl RATE_PER_THREAD
--
-- How it works, per wrk thread:
-- * A fixed timetable: request k is due at start + k / RATE_PER_THREAD, whatever the
--   server does. When a connection is free, delay() reserves the next due time and
--   waits for it (wrk's delay() is in whole milliseconds, so it waits floor(ms) and
--   may send up to 1 ms early: the timetable, not the send, stays exact on average).
-- * request() takes the next due time k and sends. The latency of request k starts at
--   min(due time, actual send time): when every connection was busy at the due time,
--   the wait for a free connection counts as latency (the wait a real client arriving
--   at that time would have seen); when the request went early, it counts from the send.
-- * Each request carries a unique transaction_id; every setup echoes it in its answer,
--   so response() finds the request's start time whatever order answers arrive in.
-- * done() writes every latency (microseconds, one per line) to $BENCH_LATENCY_FILE
--   and prints "bench.<name> <value>" counters for the driver.

local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local CLOCK_MONOTONIC = 1
local ts = ffi.new("bench_timespec")
local function now_us()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) * 1e6 + tonumber(ts.tv_nsec) / 1e3
end

-- Main state: hand each thread a number, keep the threads for done().
local threads = {}
function setup(thread)
  thread:set("thread_id", #threads)
  threads[#threads + 1] = thread
end

-- Thread state.
local prefixes, suffixes = {}, {}
local next_body = 1
local interval_us
start_us = nil
reserved = 0
sent = 0
ok = 0
bad_status = 0
unmatched = 0
early = 0
latencies = {}
local pending = {}

function init(args)
  for line in io.lines(args[1]) do
    local prefix, suffix = line:match('^(.-"transaction_id"%s*:%s*")[^"]*(".*)$')
    if prefix then
      prefixes[#prefixes + 1] = prefix
      suffixes[#suffixes + 1] = suffix
    end
  end
  assert(#prefixes > 0, "no body with a transaction_id in " .. tostring(args[1]))
  interval_us = 1e6 / tonumber(args[2])
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function delay()
  local now = now_us()
  if start_us == nil then start_us = now end
  local due = start_us + reserved * interval_us
  reserved = reserved + 1
  if due <= now then return 0 end
  return math.floor((due - now) / 1000)
end

function request()
  local now = now_us()
  if start_us == nil then start_us = now end
  local due = start_us + sent * interval_us
  sent = sent + 1
  -- wrk calls request() without delay() after it reconnects a connection the server
  -- closed: keep the reservations level with the sends.
  if reserved < sent then reserved = sent end
  local started = due
  if now < due then
    started = now
    early = early + 1
  end
  local id = "b" .. thread_id .. "-" .. sent
  pending[id] = started
  local body = prefixes[next_body] .. id .. suffixes[next_body]
  next_body = next_body % #prefixes + 1
  return wrk.format(nil, nil, nil, body)
end

function response(status, headers, body)
  local now = now_us()
  if status >= 200 and status < 300 then ok = ok + 1 else bad_status = bad_status + 1 end
  local id = body:match('"transaction_id"%s*:%s*"([^"]*)"')
  local started = id and pending[id]
  if started then
    pending[id] = nil
    latencies[#latencies + 1] = math.floor(now - started + 0.5)
  else
    unmatched = unmatched + 1
  end
end

function done(summary, latency, requests)
  local totals = { reserved = 0, sent = 0, ok = 0, bad_status = 0, unmatched = 0, early = 0 }
  local path = os.getenv("BENCH_LATENCY_FILE")
  local out = path and assert(io.open(path, "w"))
  local samples = 0
  for _, thread in ipairs(threads) do
    for name, _ in pairs(totals) do
      totals[name] = totals[name] + (thread:get(name) or 0)
    end
    local lat = thread:get("latencies") or {}
    samples = samples + #lat
    if out then
      for _, v in ipairs(lat) do out:write(v, "\n") end
    end
  end
  if out then out:close() end
  for _, name in ipairs({ "reserved", "sent", "ok", "bad_status", "unmatched", "early" }) do
    print(string.format("bench.%s %d", name, totals[name]))
  end
  print(string.format("bench.samples %d", samples))
  print(string.format("bench.duration_us %d", summary.duration))
  print(string.format("bench.requests %d", summary.requests))
  local e = summary.errors
  print(string.format("bench.errors %d %d %d %d %d", e.connect, e.read, e.write, e.status, e.timeout))
end
