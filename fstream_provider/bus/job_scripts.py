"""The job model's Lua scripts: every state change of a job is one of these, atomic with the event it emits."""

from __future__ import annotations

# Lua helper shared by the scripts: move the job (KEYS[1]) to a terminal state, emit "done" on
# KEYS[2], expire job + events + idempotency key. result_json is already JSON (or "").
_FINISH_FN = """
local function finish(state, err, result_json, now, retention, maxlen, idem)
  redis.call('HSET', KEYS[1], 'state', state, 'updated_at', now, 'error', err, 'result', result_json)
  local rj = result_json
  if rj == '' then rj = 'null' end
  local ej = 'null'
  if err ~= '' then ej = cjson.encode(err) end
  local data = '{"state":' .. cjson.encode(state) .. ',"error":' .. ej .. ',"result":' .. rj .. '}'
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'kind', 'done', 'ts', now, 'data', data)
  redis.call('EXPIRE', KEYS[1], retention)
  redis.call('EXPIRE', KEYS[2], retention)
  if idem then redis.call('EXPIRE', idem, retention) end
end
local function terminal(st)
  return st == 'succeeded' or st == 'failed' or st == 'cancelled'
end
"""

# KEYS: job, events, jobs stream, the submitter's own index (issue 40), [idem]
# ARGV: job_id, spec_json, now, idem_key, maxlen, index_cutoff, queued_data, auth_json (the submitter's
# signature, authz.signing; "" for an unsigned job, which agents refuse), retention (the own index expires with
# its newest job: a submitter that stops submitting leaves nothing behind)
SUBMIT = """
if KEYS[5] then
  local existing = redis.call('GET', KEYS[5])
  if existing then return {existing, 0} end
end
redis.call('HSET', KEYS[1], 'job_id', ARGV[1], 'state', 'queued', 'attempt', 0, 'deliveries', 0,
  'spec', ARGV[2], 'created_at', ARGV[3], 'updated_at', ARGV[3],
  'idempotency_key', ARGV[4], 'cancel_requested', 0, 'worker', '', 'error', '', 'result', '',
  'auth', ARGV[8] or '')
local sid = redis.call('XADD', KEYS[3], '*', 'job_id', ARGV[1])
redis.call('HSET', KEYS[1], 'stream_id', sid)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'kind', 'queued', 'ts', ARGV[3], 'data', ARGV[7])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[6])
if ARGV[9] and ARGV[9] ~= '' then redis.call('EXPIRE', KEYS[4], ARGV[9]) end
if KEYS[5] then redis.call('SET', KEYS[5], ARGV[1]) end
return {ARGV[1], 1}
"""

# KEYS: job, events, jobs stream, dead letter, the facility's job index, [idem]
# ARGV: worker, now, max_deliveries, maxlen, group, entry_id, retention, dead_maxlen, index_cutoff
# An entry that is not the one the job was submitted (or re-enqueued) under is acknowledged and nothing else:
# anyone who may XADD to the jobs stream could name another's job in one (issue 40), and taking it would count a
# delivery, fence out the agent running the job and make the replay guard refuse the job.
CLAIM = _FINISH_FN + """
local idem = KEYS[6]
local st = redis.call('HGET', KEYS[1], 'state')
if not st then
  redis.call('XACK', KEYS[3], ARGV[5], ARGV[6])
  return {'missing'}
end
local sid = redis.call('HGET', KEYS[1], 'stream_id')
if sid and sid ~= '' and sid ~= ARGV[6] then
  redis.call('XACK', KEYS[3], ARGV[5], ARGV[6])
  return {'foreign', sid}
end
local created = redis.call('HGET', KEYS[1], 'created_at')
if created and tonumber(created) then
  redis.call('ZADD', KEYS[5], 'NX', created, redis.call('HGET', KEYS[1], 'job_id'))
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. ARGV[9])
end
if terminal(st) then
  redis.call('XACK', KEYS[3], ARGV[5], ARGV[6])
  return {'terminal', st}
end
local d = redis.call('HINCRBY', KEYS[1], 'deliveries', 1)
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then
  local reason = redis.call('HGET', KEYS[1], 'cancel_reason') or 'cancelled'
  finish('cancelled', reason, '', ARGV[2], ARGV[7], ARGV[4], idem)
  redis.call('XACK', KEYS[3], ARGV[5], ARGV[6])
  return {'cancelled', reason}
end
local maxd = tonumber(ARGV[3])
if d > maxd then
  local last = redis.call('HGET', KEYS[1], 'worker') or ''
  local msg = 'dead-lettered: job delivered ' .. d .. ' times (max_deliveries ' .. maxd ..
    ') without finishing; last worker ' .. (last ~= '' and last or 'unknown')
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[8], '*', 'job_id', redis.call('HGET', KEYS[1], 'job_id'),
    'stream_id', ARGV[6], 'deliveries', d, 'reason', msg, 'ts', ARGV[2])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'kind', 'error', 'ts', ARGV[2],
    'data', cjson.encode({message = msg, retryable = false}))
  finish('failed', msg, '', ARGV[2], ARGV[7], ARGV[4], idem)
  redis.call('XACK', KEYS[3], ARGV[5], ARGV[6])
  return {'dead', msg}
end
local a = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'worker', ARGV[1], 'updated_at', ARGV[2])
-- the entry moves with the attempt: an old owner's TOUCH between a takeover's XCLAIM and this script must not
-- leave it in the old owner's pending list (which would read it back as its own leftover)
redis.call('XCLAIM', KEYS[3], ARGV[5], ARGV[1], 0, ARGV[6], 'JUSTID')
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'kind', 'claimed', 'ts', ARGV[2],
  'data', cjson.encode({worker = ARGV[1], attempt = a, deliveries = d}))
return {'claimed', tostring(a), redis.call('HGET', KEYS[1], 'spec') or '', redis.call('HGET', KEYS[1], 'auth') or ''}
"""

_FENCE = """
local function fenced(attempt)
  return redis.call('HGET', KEYS[1], 'attempt') == attempt and redis.call('HGET', KEYS[1], 'state') == 'running'
end
"""

# KEYS: job, events.  ARGV: attempt, maxlen, now, first, nfields, f1, v1, ..., then (kind, ts, data) triples
# ``first`` numbers the triples first, first+1, ... within the attempt (0: unnumbered, every triple appended). A
# numbered triple at or below the attempt's ``events_seq`` is already in the stream and is skipped: a batch sent
# again (a write in doubt, ``JobStore.publish``) appends each event once.
PUBLISH = _FENCE + """
if not fenced(ARGV[1]) then return {0, 0} end
local first = tonumber(ARGV[4])
local last = 0
if first > 0 then
  local seen = redis.call('HGET', KEYS[1], 'events_seq')
  if seen then
    local a, n = string.match(seen, '^(%d+):(%d+)$')
    if a == ARGV[1] then last = tonumber(n) end
  end
end
local n = tonumber(ARGV[5])
local i = 6
if n > 0 then
  local hs = {}
  for j = 0, 2 * n - 1 do hs[#hs + 1] = ARGV[i + j] end
  redis.call('HSET', KEYS[1], unpack(hs))
  i = i + 2 * n
end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[3])
local seq = first
while i + 2 <= #ARGV do
  if first == 0 or seq > last then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'kind', ARGV[i], 'ts', ARGV[i + 1], 'data', ARGV[i + 2])
  end
  seq = seq + 1
  i = i + 3
end
if first > 0 and seq - 1 > last then redis.call('HSET', KEYS[1], 'events_seq', ARGV[1] .. ':' .. (seq - 1)) end
return {1, tonumber(redis.call('HGET', KEYS[1], 'cancel_requested') or '0')}
"""

# KEYS: job, jobs stream.  ARGV: attempt, group, consumer, entry_id
TOUCH = _FENCE + """
if not fenced(ARGV[1]) then return {0, 0} end
redis.call('XCLAIM', KEYS[2], ARGV[2], ARGV[3], 0, ARGV[4], 'JUSTID')
return {1, tonumber(redis.call('HGET', KEYS[1], 'cancel_requested') or '0')}
"""

# KEYS: job, events, jobs stream, [idem]
# ARGV: attempt, state, error, result_json, now, group, entry_id, retention, maxlen, totals_json, outcome_sig
# (totals: the result's sums, which the overview reads instead of the whole result; outcome_sig: the agent's
# signature of the outcome as stored, authz.outcome, "" for an agent without a key)
FINISH = _FINISH_FN + _FENCE + """
if not fenced(ARGV[1]) then return 0 end
finish(ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[8], ARGV[9], KEYS[4])
if ARGV[10] and ARGV[10] ~= '' then redis.call('HSET', KEYS[1], 'totals', ARGV[10]) end
redis.call('HSET', KEYS[1], 'outcome_sig', ARGV[11] or '')
redis.call('XACK', KEYS[3], ARGV[6], ARGV[7])
return 1
"""

# A claimed job the agent's policy refuses (unsigned, wrongly signed, replayed, outside the roots): dead-lettered
# with the reason, failed, acknowledged; nothing of it was read.
# KEYS: job, events, jobs stream, dead letter, [idem]
# ARGV: attempt, reason, now, group, entry_id, retention, maxlen, dead_maxlen, outcome_sig (a refusal is an agent's
# outcome too: state failed, the reason as error, no result)
REJECT = _FINISH_FN + _FENCE + """
if not fenced(ARGV[1]) then return 0 end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[8], '*', 'job_id', redis.call('HGET', KEYS[1], 'job_id'),
  'stream_id', ARGV[5], 'deliveries', redis.call('HGET', KEYS[1], 'deliveries') or '0', 'reason', ARGV[2],
  'ts', ARGV[3], 'kind', 'refused')
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*', 'kind', 'error', 'ts', ARGV[3],
  'data', cjson.encode({message = ARGV[2], retryable = false, refused = true}))
finish('failed', ARGV[2], '', ARGV[3], ARGV[6], ARGV[7], KEYS[5])
redis.call('HSET', KEYS[1], 'outcome_sig', ARGV[9] or '')
redis.call('XACK', KEYS[3], ARGV[4], ARGV[5])
return 1
"""

# An agent that stops (drain, SIGTERM) gives its running job back; the delivery it used is given back too (a
# stopping agent is not a failed try: a long stream restarted with its agents must not be dead-lettered).
# KEYS: job, events.  ARGV: attempt, reason, now, maxlen
RELEASE = _FENCE + """
if not fenced(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'queued', 'worker', '', 'updated_at', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'deliveries', -1)
redis.call('HINCRBY', KEYS[1], 'releases', 1)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'kind', 'released', 'ts', ARGV[3],
  'data', cjson.encode({reason = ARGV[2], attempt = tonumber(ARGV[1])}))
return 1
"""

# A running job stopped at its checkpoint for a job the scheduler ranks higher (SEAL §4.3): state
# 'preempted' with the reason; the delivery it used is given back (a preemption is not a failed try).
# KEYS: job, events.  ARGV: attempt, reason, now, maxlen, data_json
PREEMPT = _FENCE + """
if not fenced(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'preempted', 'worker', '', 'updated_at', ARGV[3], 'preempt_reason', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'deliveries', -1)
redis.call('HINCRBY', KEYS[1], 'preemptions', 1)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'kind', 'preempted', 'ts', ARGV[3], 'data', ARGV[5])
return 1
"""

# KEYS: job, events, [idem].  ARGV: reason, now, retention, maxlen
CANCEL = _FINISH_FN + """
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'missing' end
if terminal(st) then return 'terminal' end
redis.call('HSET', KEYS[1], 'cancel_requested', 1, 'cancel_reason', ARGV[1])
if st == 'queued' or st == 'preempted' then
  finish('cancelled', ARGV[1], '', ARGV[2], ARGV[3], ARGV[4], KEYS[3])
  return 'cancelled'
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'kind', 'cancel', 'ts', ARGV[2],
  'data', cjson.encode({reason = ARGV[1]}))
return 'requested'
"""
