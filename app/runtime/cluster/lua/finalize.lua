-- End the buffer of a stream whose replica died with STREAM_LOST and done.
-- KEYS: frames, meta, the owner's alive key. ARGV: the last entry's frame id as read,
-- entry id, first frame id, bytes, ttl ms. -1: the owner lives; 0: the stream has ended;
-- -2: frames arrived meanwhile (read again); 1: the buffer now ends in STREAM_LOST.
if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
if redis.call('HGET', KEYS[2], 'state') ~= 'running' then return 0 end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local n = 0
if #last > 0 then n = tonumber(string.match(last[1][1], '^(%d+)')) end
if n ~= tonumber(ARGV[1]) then return -2 end
redis.call('XADD', KEYS[1], ARGV[2], 'f', ARGV[3], 'd', ARGV[4], 'e', '1', 'l', '1')
redis.call('HSET', KEYS[2], 'state', 'lost')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1
