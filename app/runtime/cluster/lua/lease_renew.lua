-- Renew the leases still held in a sorted set (tool slots, stream leases).
-- KEYS: the set. ARGV: lease ms, tokens...
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i]) end
if #ARGV > 1 then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 4) end
return 1
