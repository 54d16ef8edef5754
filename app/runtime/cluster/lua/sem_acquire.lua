-- The fair semaphore: take a slot, or queue for one.
-- KEYS: holders (token -> lease end), queue (token -> ticket), queue liveness
-- (token -> lease end), ticket counter. ARGV: token, limit, lease ms. Times are Redis's
-- own (TIME), so replicas' clocks never disagree. 1: the slot is held.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, m in ipairs(dead) do redis.call('ZREM', KEYS[2], m) end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], lease * 4) end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), ARGV[1])
  redis.call('PEXPIRE', KEYS[4], lease * 4)
end
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
if redis.call('ZCARD', KEYS[1]) + rank < tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease * 4)
  return 1
end
redis.call('ZADD', KEYS[3], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[3], lease * 4)
return 0
