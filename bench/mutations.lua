-- mutations.lua - wrk script: each connection's thread submits small batch services and
-- releases them 256 behind, so about half the requests are submits and half releases, and
-- the pool never fills. Argument: a prefix that keeps ids unique across runs.
-- wrk calls request() once in a thread without sending what it returns, so the first id of a
-- thread is never submitted and its release answers 404: at most one non-2xx per thread,
-- which run-daemon.sh reports and leaves out of the durable mutations.
local made, released = 0, 0
local prefix = "r"
local n_threads = 0
function setup(thread)
    n_threads = n_threads + 1
    thread:set("tid", n_threads)
end
function init(args)
    prefix = (args[1] or "r") .. "-t" .. tostring(tid)
end
function request()
    if made - released > 256 then
        released = released + 1
        return wrk.format("DELETE", string.format("/v1/services/%s-%d", prefix, released))
    end
    made = made + 1
    return wrk.format("POST", "/v1/services", {["Content-Type"] = "application/json"},
        string.format('{"id":"%s-%d","class":"batch","vram_mib":1024}', prefix, made))
end
