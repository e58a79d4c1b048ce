"""The Lua steps of ``CeleryRunRegistry``: each state change of a run is one script.

Pure text, loaded by ``redis.RedisBackend``. Every script starts with
``PRELUDE`` (key helpers, ``xadd``, ``close_failed``, ``reap``, ``fenced``).
ARGV[1] is always the key prefix and ARGV[2] the run id; KEYS[1] is the run
hash. Scripts derive the other keys from the prefix (standalone Redis only).
Rules: a run's stream entry ids are ``0-<seq>``; the run's own ``buf`` and
``keep`` (stored at start) decide trimming and expiry; a worker's write is
refused unless it holds the run's token, the run is running and its
heartbeat has not lapsed (a lapsed run is reaped first: "worker lost").
"""

from __future__ import annotations

PRELUDE = r"""
local P = ARGV[1]
local id = ARGV[2]
local function rk(rid, suffix) return P .. ':run:' .. rid .. suffix end
local function ck(conv, suffix) return P .. ':conv:' .. conv .. suffix end

-- The run's own buffer and keep time (set by the registry that started it) win.
local function xadd(rid, seq, data, buf, approx)
  local b = tonumber(redis.call('HGET', rk(rid, ''), 'buf') or buf)
  if b >= 1000 then
    redis.call('XADD', rk(rid, ':ev'), 'MAXLEN', '~', b, '0-' .. seq, 'd', data)
  else
    redis.call('XADD', rk(rid, ':ev'), 'MAXLEN', b, '0-' .. seq, 'd', data)
  end
  redis.call('HSET', rk(rid, ''), 'seq', seq)
end

local function expire_run(rid, keep_ms)
  local k = redis.call('HGET', rk(rid, ''), 'keep') or keep_ms
  for _, s in ipairs({'', ':ev', ':steer', ':left', ':done'}) do
    redis.call('PEXPIRE', rk(rid, s), k)
  end
end

local function release(rid, conv)
  local lock = ck(conv, ':lock')
  if redis.call('GET', lock) == rid then redis.call('DEL', lock) end
end

local function signal_end(rid, keep_ms)
  redis.call('DEL', rk(rid, ':hb'))
  redis.call('RPUSH', rk(rid, ':done'), '1')
  redis.call('SREM', P .. ':active', rid)
  redis.call('PUBLISH', rk(rid, ':ctl'), 'e')
  expire_run(rid, keep_ms)
end

-- A run that cannot end on a worker (lost, expired in the queue, not enqueued,
-- cancelled while it waited to resume): a run_end event, every accepted steer
-- returned, lock released.
local function close_ended(rid, state, err, err_type, now, keep_ms, buf, approx)
  local h = rk(rid, '')
  local f = redis.call('HMGET', h, 'session_id', 'turns', 'started_at', 'created_at', 'conv', 'seq')
  local started = tonumber(f[3] or f[4] or now)
  local ev = cjson.encode({type = 'run_end', session_id = f[1] or '', run_id = rid,
    success = false, error = err, total_turns = tonumber(f[2] or '0'),
    duration_ms = (tonumber(now) - started) * 1000, error_type = err_type})
  xadd(rid, tonumber(f[6] or '0') + 1, ev, buf, approx)
  for _, s in ipairs(redis.call('LRANGE', rk(rid, ':steer'), 0, -1)) do
    redis.call('RPUSH', rk(rid, ':left'), s)
  end
  redis.call('HSET', h, 'state', state, 'error', err, 'error_type', err_type, 'ended_at', now)
  release(rid, f[5])
  signal_end(rid, keep_ms)
end

-- A cancel stored for a run that is not on any worker (waiting to resume).
local function close_cancelled(rid, now, keep_ms, buf, approx)
  local reason = redis.call('HGET', rk(rid, ''), 'cancel_reason')
  local err = 'run cancelled'
  if reason then err = err .. ': ' .. reason end
  close_ended(rid, 'cancelled', err, 'Cancelled', now, keep_ms, buf, approx)
end

-- A run that can no longer run (lost, expired in the queue, not enqueued) ends
-- failed, unless a cancel was taken for it (CANCEL returned 1): then it ends
-- cancelled, as that cancel said it would.
local function close_failed(rid, err, err_type, now, keep_ms, buf, approx)
  if redis.call('HGET', rk(rid, ''), 'cancel') == '1' then
    close_cancelled(rid, now, keep_ms, buf, approx)
  else
    close_ended(rid, 'failed', err, err_type, now, keep_ms, buf, approx)
  end
end

-- Back on the queue from its last checkpoint (a durable run): the conversation
-- lock is kept for queue_timeout, the worker's token is void, and the run's id
-- goes to the outbox, whose entries a worker's sweeper sends as task messages.
-- False when another run holds the conversation (the run cannot continue).
local function requeue(rid, cause, now, is_loss)
  local h = rk(rid, '')
  local f = redis.call('HMGET', h, 'conv', 'queue_ms', 'resumes', 'losses')
  local lock = ck(f[1], ':lock')
  local holder = redis.call('GET', lock)
  if holder and holder ~= rid then return false end
  redis.call('SET', lock, rid, 'PX', f[2] or '3600000')
  redis.call('HSET', h, 'state', 'queued', 'token', '', 'resumes', tonumber(f[3] or '0') + 1,
    'resume_cause', cause, 'requeued_at', now)
  if is_loss then redis.call('HSET', h, 'losses', tonumber(f[4] or '0') + 1) end
  redis.call('HDEL', h, 'rsv', 'ending')  -- resumed from its checkpoint, the run goes on: cancels reach it again
  redis.call('DEL', rk(rid, ':hb'))
  redis.call('ZADD', P .. ':outbox', 0, rid)
  return true
end

-- A run that can no longer go on where it was: its worker stopped heartbeating
-- (a durable run goes back on the queue: 2; else it fails: 1), or it sat in the
-- queue until its conversation lock expired (queue_timeout: 1). 0: nothing to do.
local function reap(rid, now, keep_ms, buf, approx)
  local h = rk(rid, '')
  local st = redis.call('HGET', h, 'state')
  if st == 'queued' then
    if redis.call('GET', ck(redis.call('HGET', h, 'conv'), ':lock')) == rid then return 0 end
    close_failed(rid, 'no worker picked the run up within queue_timeout; it never started',
      'LoopError', now, keep_ms, buf, approx)
    return 1
  end
  if st ~= 'running' then return 0 end
  if redis.call('EXISTS', rk(rid, ':hb')) == 1 then return 0 end
  local f = redis.call('HMGET', h, 'worker', 'resume', 'max_resumes', 'losses', 'cancel')
  local worker = f[1] or '?'
  local losses = tonumber(f[4] or '0')
  local tail = '; it was not re-executed'
  if f[2] == 'on_worker_loss' then
    if f[5] == '1' then
      close_cancelled(rid, now, keep_ms, buf, approx)
      return 1
    end
    if losses < tonumber(f[3] or '0') then
      if requeue(rid, 'worker lost: ' .. worker .. ' stopped heartbeating', now, true) then return 2 end
      tail = '; another run holds its conversation, so it was not resumed'
    else
      tail = '; it was resumed ' .. losses .. ' times after worker loss (max_resumes ' ..
        (f[3] or '0') .. ') and is not resumed again'
    end
  end
  close_failed(rid, 'worker lost: run ' .. rid .. ' on ' .. worker ..
    ' stopped heartbeating' .. tail, 'WorkerLost', now, keep_ms, buf, approx)
  return 1
end

-- The worker's fence: its token, still running, heartbeat not lapsed.
local function fenced(token, now, keep_ms, buf, approx)
  local h = rk(id, '')
  if redis.call('HGET', h, 'token') ~= token then return true end
  if redis.call('HGET', h, 'state') ~= 'running' then return true end
  if reap(id, now, keep_ms, buf, approx) ~= 0 then return true end
  return false
end
"""

# ARGV: P id conv input config factory now queue_ms keep_ms buf approx resume max_resumes queue
#       lease_ms (a message lost before any worker noted it is sent again after the lease)
#       owner ('' for none; recorded in the same step, so no read sees the run unowned)
START = r"""
local now, keep, buf, approx = ARGV[7], ARGV[9], ARGV[10], ARGV[11]
local h = rk(id, '')
if redis.call('EXISTS', h) == 1 then return {'dup'} end
local conv = ARGV[3]
local lock = ck(conv, ':lock')
local holder = redis.call('GET', lock)
if holder then
  reap(holder, now, keep, buf, approx)
  local st = redis.call('HGET', rk(holder, ''), 'state')
  if redis.call('GET', lock) == holder and (st == 'queued' or st == 'running') then
    return {'busy', holder}
  end
end
redis.call('SET', lock, id, 'PX', ARGV[8])
redis.call('HSET', h, 'state', 'queued', 'conv', conv, 'input', ARGV[4], 'config', ARGV[5],
  'factory', ARGV[6], 'created_at', now, 'seq', 0, 'turns', 0, 'tool_calls', 0,
  'input_tokens', 0, 'output_tokens', 0, 'buf', buf, 'keep', keep,
  'resume', ARGV[12], 'max_resumes', ARGV[13], 'queue', ARGV[14], 'queue_ms', ARGV[8], 'resumes', 0)
if ARGV[16] and ARGV[16] ~= '' then redis.call('HSET', h, 'owner', ARGV[16]) end
redis.call('ZADD', P .. ':runs', now, id)
redis.call('SADD', P .. ':active', id)
redis.call('ZADD', P .. ':outbox', math.floor(tonumber(now) * 1000) + tonumber(ARGV[15]), id)
return {'ok'}
"""

# ARGV: P id token hb_ms now worker keep_ms buf approx
CLAIM = r"""
local token, hb, now, keep, buf, approx = ARGV[3], ARGV[4], ARGV[5], ARGV[7], ARGV[8], ARGV[9]
local h = rk(id, '')
local st = redis.call('HGET', h, 'state')
if st ~= 'queued' then return {'skip', st or ''} end
local f = redis.call('HMGET', h, 'conv', 'input', 'config', 'factory', 'cancel', 'cancel_reason', 'buf')
if redis.call('GET', ck(f[1], ':lock')) ~= id then
  close_failed(id, 'no worker picked the run up within queue_timeout; it never started',
    'LoopError', now, keep, buf, approx)
  return {'expired'}
end
local g = redis.call('HMGET', h, 'started_at', 'ckpt', 'resumes', 'resume_cause', 'seq', 'resume')
local started = g[1] or now  -- a resumed run keeps its first start
redis.call('HSET', h, 'state', 'running', 'token', token, 'worker', ARGV[6], 'started_at', started)
redis.call('HDEL', h, 'rsv')
redis.call('SET', rk(id, ':hb'), token, 'PX', hb)
redis.call('PEXPIRE', ck(f[1], ':lock'), hb * 3)
local hist = redis.call('GET', ck(f[1], ':hist'))
local out = {'ok', f[1], f[2], f[3] or '', f[4], f[5] or '', f[6] or '', hist or '', f[7] or buf,
  g[2] or '', g[3] or '0', g[4] or '', g[5] or '0', g[6] or '', started}
for _, s in ipairs(redis.call('LRANGE', rk(id, ':steer'), 0, -1)) do table.insert(out, s) end
return out
"""

# ARGV: P id token now keep buf approx session turns tool_calls in_tok out_tok ckpt ckpt_seq
#       (seq data)...; ckpt '' = none. Events and checkpoint land together or not at all.
APPEND = r"""
local token, now, keep, buf, approx = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
if fenced(token, now, keep, buf, approx) then return 0 end
for i = 15, #ARGV, 2 do xadd(id, ARGV[i], ARGV[i + 1], buf, approx) end
redis.call('HSET', rk(id, ''), 'session_id', ARGV[8], 'turns', ARGV[9], 'tool_calls', ARGV[10],
  'input_tokens', ARGV[11], 'output_tokens', ARGV[12])
if ARGV[13] ~= '' then redis.call('HSET', rk(id, ''), 'ckpt', ARGV[13], 'ckpt_seq', ARGV[14]) end
return 1
"""

# ARGV: P id token hb_ms now keep buf approx
HEARTBEAT = r"""
local token, hb, now, keep, buf, approx = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
if fenced(token, now, keep, buf, approx) then return 0 end
redis.call('SET', rk(id, ':hb'), token, 'PX', hb)
local f = redis.call('HMGET', rk(id, ''), 'conv', 'cancel', 'cancel_reason')
local lock = ck(f[1], ':lock')
-- Longer than the heartbeat: a lapsed durable run keeps its conversation until it is reaped.
if redis.call('GET', lock) == id then redis.call('PEXPIRE', lock, hb * 3) end
-- What the worker's bridge should already have: the safety net for a missed message.
return {1, f[2] or '', f[3] or '', redis.call('LLEN', rk(id, ':steer'))}
"""

# ARGV: 1 P, 2 id, 3 token, 4 now, 5 keep, 6 buf, 7 approx, 8 state, 9 output, 10 error,
#       11 error_type, 12 run_json, 13 hist_json ('' = no commit), 14 steer cursor, 15 seq,
#       16 run_end_json, 17 session, 18 turns, 19 tool_calls, 20 in_tok, 21 out_tok,
#       22 started_at, 23... local leftovers (message JSON)
FINISH = r"""
local token, now, keep, buf, approx = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
if fenced(token, now, keep, buf, approx) then return 0 end
local h = rk(id, '')
local seq = math.max(tonumber(ARGV[15]), tonumber(redis.call('HGET', h, 'seq') or '0') + 1)
xadd(id, seq, ARGV[16], buf, approx)
for i = 23, #ARGV do redis.call('RPUSH', rk(id, ':left'), ARGV[i]) end
for _, s in ipairs(redis.call('LRANGE', rk(id, ':steer'), tonumber(ARGV[14]), -1)) do
  redis.call('RPUSH', rk(id, ':left'), s)
end
redis.call('HSET', h, 'state', ARGV[8], 'output', ARGV[9], 'error', ARGV[10],
  'error_type', ARGV[11], 'run', ARGV[12], 'ended_at', now, 'session_id', ARGV[17],
  'turns', ARGV[18], 'tool_calls', ARGV[19], 'input_tokens', ARGV[20],
  'output_tokens', ARGV[21], 'started_at', ARGV[22])
local conv = redis.call('HGET', h, 'conv')
if ARGV[13] ~= '' and redis.call('GET', ck(conv, ':lock')) == id then
  redis.call('SET', ck(conv, ':hist'), ARGV[13])
end
release(id, conv)
signal_end(id, keep)
return seq
"""

# ARGV: P id token now keep buf approx
# The worker's run reached its ending point (the last moment a cancel reaches
# it). A cancel stored before it ends the run cancelled: {1, reason or nil}.
# Otherwise the run is marked ``ending``, so a later CANCEL answers 0, as for
# an ended run: {0}. A fenced-out worker gets {0} and marks nothing.
ENDING = r"""
local token, now, keep, buf, approx = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
if fenced(token, now, keep, buf, approx) then return {0} end
local h = rk(id, '')
local f = redis.call('HMGET', h, 'cancel', 'cancel_reason')
if f[1] == '1' then return {1, f[2]} end
redis.call('HSET', h, 'ending', '1')
return {0}
"""

# ARGV: P id now keep buf approx has_reason reason
CANCEL = r"""
local now, keep, buf, approx = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local h = rk(id, '')
reap(id, now, keep, buf, approx)
local st = redis.call('HGET', h, 'state')
if not st then return -1 end
if st ~= 'queued' and st ~= 'running' then return 0 end
if redis.call('HGET', h, 'ending') then return 0 end  -- past its ending point: too late, as for an ended run
if not redis.call('HGET', h, 'cancel') then
  redis.call('HSET', h, 'cancel', '1')
  if ARGV[7] == '1' then redis.call('HSET', h, 'cancel_reason', ARGV[8]) end
end
if st == 'queued' and tonumber(redis.call('HGET', h, 'resumes') or '0') > 0 then
  close_cancelled(id, now, keep, buf, approx)  -- waiting to resume: it never resumes
  return 1
end
redis.call('PUBLISH', rk(id, ':ctl'), 'c' .. ARGV[7] .. ARGV[8])
return 1
"""

# ARGV: P id now keep buf approx message_json
STEER = r"""
local now, keep, buf, approx = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local h = rk(id, '')
reap(id, now, keep, buf, approx)
local st = redis.call('HGET', h, 'state')
if not st then return -1 end
if st ~= 'queued' and st ~= 'running' then return 0 end
local n = redis.call('RPUSH', rk(id, ':steer'), ARGV[7])
redis.call('PUBLISH', rk(id, ':ctl'), 's' .. (n - 1) .. ' ' .. ARGV[7])
return 1
"""

# ARGV: P id now keep buf approx
STATUS = r"""
reap(id, ARGV[3], ARGV[4], ARGV[5], ARGV[6])
return redis.call('HGETALL', rk(id, ''))
"""

# ARGV: P id now keep buf approx error
ABORT = r"""
if redis.call('HGET', rk(id, ''), 'state') ~= 'queued' then return 0 end
close_failed(id, ARGV[7], 'LoopError', ARGV[3], ARGV[4], ARGV[5], ARGV[6])
return 1
"""


# ARGV: P id token now keep buf approx cause
HANDBACK = r"""
local token, now, keep, buf, approx = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
if fenced(token, now, keep, buf, approx) then return 0 end
if redis.call('HGET', rk(id, ''), 'cancel') == '1' then
  close_cancelled(id, now, keep, buf, approx)
  return 2
end
if requeue(id, ARGV[8], now, false) then return 1 end
close_failed(id, 'the worker shut down and another run holds the conversation; not resumed',
  'WorkerLost', now, keep, buf, approx)
return 3
"""

# ARGV: P id worker ttl_ms
RESERVE = r"""
redis.call('SET', P .. ':worker:' .. ARGV[3], '1', 'PX', ARGV[4])
if redis.call('HGET', rk(id, ''), 'state') == 'queued' then
  redis.call('HSET', rk(id, ''), 'rsv', ARGV[3])
end
return 1
"""

# ARGV: P '' now keep buf approx worker ttl_ms lease_ms
# The sweeper's step (every worker process, every heartbeat interval): say this
# worker is alive, reap every live run (a lapsed durable run is requeued), send
# again a queued run whose message a now-dead worker had reserved, and lease the
# outbox's due entries to this caller: {run id, conversation, queue}...
SWEEP = r"""
local now, keep, buf, approx = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local now_ms = math.floor(tonumber(now) * 1000)
redis.call('SET', P .. ':worker:' .. ARGV[7], '1', 'PX', ARGV[8])
local active = P .. ':active'
local outbox = P .. ':outbox'
for _, rid in ipairs(redis.call('SMEMBERS', active)) do
  local h = rk(rid, '')
  if redis.call('EXISTS', h) == 0 then
    redis.call('SREM', active, rid)
  else
    reap(rid, now, keep, buf, approx)
    local f = redis.call('HMGET', h, 'state', 'rsv')
    if f[1] == 'queued' and f[2] and redis.call('EXISTS', P .. ':worker:' .. f[2]) == 0 then
      redis.call('HDEL', h, 'rsv')
      redis.call('ZADD', outbox, 0, rid)
    end
  end
end
local out = {}
for _, rid in ipairs(redis.call('ZRANGEBYSCORE', outbox, '-inf', now_ms)) do
  local f = redis.call('HMGET', rk(rid, ''), 'state', 'conv', 'queue', 'rsv')
  if f[1] == 'queued' then
    -- Leased, not removed: due again after the lease unless claimed meanwhile;
    -- sent only when no live worker holds its message.
    redis.call('ZADD', outbox, now_ms + tonumber(ARGV[9]), rid)
    if not f[4] or redis.call('EXISTS', P .. ':worker:' .. f[4]) == 0 then
      table.insert(out, rid)
      table.insert(out, f[2])
      table.insert(out, f[3] or '')
    end
  else
    redis.call('ZREM', outbox, rid)
  end
end
return out
"""

__all__ = [
    "PRELUDE", "START", "CLAIM", "APPEND", "HEARTBEAT", "ENDING", "FINISH", "CANCEL", "STEER", "STATUS",
    "ABORT", "HANDBACK", "RESERVE", "SWEEP",
]

