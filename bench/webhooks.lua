-- wrk script: every request is a distinct pre-signed webhook read from files written by
-- bench/common.py (write_requests), one file per wrk thread, requests separated by NUL bytes.
-- Usage: wrk ... -s bench/webhooks.lua URL -- <requests prefix> <threads>
-- At the end it prints one line "WRKJSON {...}" with the figures bench/common.py parses.

local threads = {}
local next_id = 0

function setup(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  local prefix = args[1]
  local f = assert(io.open(prefix .. "-" .. tid .. ".bin", "rb"))
  local data = f:read("*a")
  f:close()
  pool = {}
  local n, pos = 0, 1
  while true do
    local stop = string.find(data, "\0", pos, true)
    if not stop then break end
    n = n + 1
    pool[n] = string.sub(data, pos, stop - 1)
    pos = stop + 1
  end
  size = n
  sent = 0
  reused = 0
end

function request()
  sent = sent + 1
  if sent > size then
    -- The pool ran out: from here ids repeat (the benchmark reports it and sizes up).
    reused = reused + 1
  end
  return pool[((sent - 1) % size) + 1]
end

function done(summary, latency, requests)
  local reused_total = 0
  for _, t in ipairs(threads) do
    reused_total = reused_total + (t:get("reused") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"max_us":%d,' ..
    '"status_errors":%d,"connect":%d,"read":%d,"write":%d,"timeout":%d,"reused":%d}\n',
    summary.requests, summary.duration, latency:percentile(50.0), latency:percentile(99.0),
    latency.max, e.status, e.connect, e.read, e.write, e.timeout, reused_total))
end
