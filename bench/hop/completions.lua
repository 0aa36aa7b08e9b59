-- wrk script for the hop benchmark: POST /v1/completions with a different prompt on every request.
-- STREAM=1 in the environment asks for SSE; wrk reads each chunked answer to its end. MAX_TOKENS (4): the
-- answer's length; over 4 the replica streams it token by token (bench/hop/fake_replica.py).
local counter = 0
local threads = 0
local stream = os.getenv("STREAM") == "1"
local model = os.getenv("MODEL") or "bench-model"
local max_tokens = tonumber(os.getenv("MAX_TOKENS") or "4")
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

setup = function(thread)
  threads = threads + 1
  thread:set("id", threads)
end

request = function()
  counter = counter + 1
  local body = string.format(
    '{"model":"%s","prompt":"request %d from thread %s: tell me about prefix caching","max_tokens":%d,"stream":%s}',
    model, counter, tostring(id), max_tokens, stream and "true" or "false")
  return wrk.format(nil, "/v1/completions", nil, body)
end

done = function(summary, latency, requests)
  io.write(string.format("WRK_RESULT requests=%d errors=%d status=%d seconds=%.3f p50_ms=%.3f p99_ms=%.3f\n",
    summary.requests, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, summary.duration / 1e6, latency:percentile(50) / 1e3, latency:percentile(99) / 1e3))
end
