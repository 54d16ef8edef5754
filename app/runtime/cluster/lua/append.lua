-- Append a batch of frames to a stream's resume buffer.
-- KEYS: frames, meta[, idem]. ARGV: entry id, first frame id, bytes, final (0/1), ttl ms,
-- owner, the API key name that started it ("" for none). A stream another replica declared
-- lost takes no more frames.
local state = redis.call('HGET', KEYS[2], 'state')
if state == 'lost' then return 0 end
local added = redis.pcall('XADD', KEYS[1], ARGV[1], 'f', ARGV[2], 'd', ARGV[3], 'e', ARGV[4])
if type(added) == 'table' and added.err then
  -- The buffer already holds this entry id: a call the mirror gave up waiting for (a
  -- timeout) ran after all, whole, as scripts do. It is written; the rest was done too.
  if string.find(added.err, 'equal or smaller', 1, true) then return 1 end
  return redis.error_reply(added.err)
end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], 'state', 'done', 'owner', ARGV[6])
elseif not state then
  redis.call('HSET', KEYS[2], 'state', 'running', 'owner', ARGV[6])
end
if ARGV[7] ~= '' then redis.call('HSET', KEYS[2], 'key', ARGV[7]) end
for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
return 1
