-- Claim an Idempotency-Key for a new stream.
-- KEYS: idem, meta. ARGV: body hash, stream id, owner, ttl ms, API key name ("" for none).
-- Returns 1 (claimed) or the record already there: {body hash, stream id}.
local rec = redis.call('HMGET', KEYS[1], 'h', 's')
if rec[1] then return rec end
redis.call('HSET', KEYS[1], 'h', ARGV[1], 's', ARGV[2])
redis.call('HSET', KEYS[2], 'state', 'running', 'owner', ARGV[3])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[2], 'key', ARGV[5]) end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
