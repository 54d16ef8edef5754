-- A per-key fixed window, on Redis's clock.
-- KEYS: the key's counter prefix. ARGV: requests, window ms. Returns 0 (go on) or the ms
-- until the window turns. Over the limit the request still counts.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
local index = math.floor(now / window)
local key = KEYS[1] .. ':' .. index
local count = redis.call('INCR', key)
if count == 1 then redis.call('PEXPIRE', key, window) end
if count <= tonumber(ARGV[1]) then return 0 end
return (index + 1) * window - now
