// `muse_fake serve` (the fake model) driven by the official `openai` and
// `@anthropic-ai/sdk` packages, plus raw HTTP for every bad input of
// server-api.md §3.3. Run by tests/server/js/run.sh (MUSE_BIN = build/muse_fake).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { postRaw } from './serve.mjs';

const KEY = 'test-key';
let server, base, openai, anthropic;

before(async () => {
  server = spawn(process.env.MUSE_BIN, ['serve', '--host', '127.0.0.1', '--port', '0',
    '--served-model-name', 'muse-fake,muse-alias', '--api-key', KEY, '--max-model-len', '2048',
    '--max-request-body-mb', '1', '--step-ms', '0.5', '--disable-log-requests'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log)), 15000);
    server.stderr.on('data', (d) => {
      log += d;
      const m = /ready: http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    server.on('exit', (code) => reject(new Error(`server exited ${code}:\n${log}`)));
  });
  base = `http://127.0.0.1:${port}`;
  openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: base, apiKey: KEY, maxRetries: 0 });
});

after(async () => {
  if (!server) return;
  const exited = new Promise((r) => server.on('exit', (code, signal) => r({ code, signal })));
  server.kill('SIGTERM');
  const { code } = await exited;
  assert.equal(code, 0, 'muse serve exits 0 on SIGTERM');
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' }, units: { type: 'string' } } },
  },
};
const timeTool = {
  type: 'function',
  function: { name: 'get_time', description: 'Time', parameters: { type: 'object', properties: { zone: { type: 'string' } } } },
};
const user = (content) => [{ role: 'user', content }];

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

test('models lists the served names', async () => {
  const models = await openai.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['muse-fake', 'muse-alias']);
});

test('chat completion: content, both reasoning fields, usage', async () => {
  const r = await openai.chat.completions.create({ model: 'muse-fake', messages: user('echo: hello world') });
  const m = r.choices[0].message;
  assert.equal(m.content, 'hello world');
  assert.equal(m.reasoning, 'The user said: echo: hello world.');
  assert.equal(m.reasoning_content, m.reasoning);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
  assert.equal(r.object, 'chat.completion');
});

test('chat streaming: role first, deltas, usage chunk, then done', async () => {
  const chunks = await collect(await openai.chat.completions.create({
    model: 'muse-alias', messages: user('echo: streamed ünïcode 😀 text'), stream: true, stream_options: { include_usage: true },
  }));
  assert.deepEqual(chunks[0].choices[0].delta, { role: 'assistant', content: '' });
  let content = '', reasoning = '', reasoningContent = '', finish = null;
  for (const c of chunks) {
    for (const ch of c.choices) {
      content += ch.delta.content ?? '';
      reasoning += ch.delta.reasoning ?? '';
      reasoningContent += ch.delta.reasoning_content ?? '';
      finish = ch.finish_reason ?? finish;
    }
  }
  assert.equal(content, 'streamed ünïcode 😀 text');
  assert.equal(reasoning, reasoningContent);
  assert.equal(finish, 'stop');
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.ok(last.usage.completion_tokens > 0);
  for (const c of chunks.slice(0, -1)) assert.equal(c.usage, null);
});

test('tools, streamed: argument deltas reassemble to valid JSON', async () => {
  const chunks = await collect(await openai.chat.completions.create({
    model: 'muse-fake', messages: user('what is the weather in Paris?'), tools: [weatherTool], stream: true,
  }));
  const calls = {};
  let finish;
  for (const c of chunks) {
    for (const ch of c.choices) {
      finish = ch.finish_reason ?? finish;
      for (const tc of ch.delta.tool_calls ?? []) {
        if (!calls[tc.index]) {
          assert.ok(tc.id && tc.type === 'function' && tc.function.name, 'first delta names the call');
          calls[tc.index] = { id: tc.id, name: tc.function.name, args: '' };
        } else {
          assert.equal(tc.id, undefined, 'id only once');
        }
        calls[tc.index].args += tc.function?.arguments ?? '';
      }
    }
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(Object.keys(calls).length, 1);
  assert.equal(calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].args), { city: 'Paris', days: 3, units: 'x-units ü' });
});

test('tools, whole: content null, arguments a JSON string; parallel calls and parallel_tool_calls=false', async () => {
  const r = await openai.chat.completions.create({ model: 'muse-fake', messages: user('call tools in parallel'), tools: [weatherTool, timeTool] });
  const m = r.choices[0].message;
  assert.equal(m.content, null);
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.deepEqual(m.tool_calls.map((c) => c.function.name), ['get_weather', 'get_time']);
  for (const c of m.tool_calls) assert.equal(typeof JSON.parse(c.function.arguments), 'object');
  const one = await openai.chat.completions.create({
    model: 'muse-fake', messages: user('call tools in parallel'), tools: [weatherTool, timeTool], parallel_tool_calls: false,
  });
  assert.equal(one.choices[0].message.tool_calls.length, 1);
  const named = await openai.chat.completions.create({
    model: 'muse-fake', messages: user('hello'), tools: [weatherTool, timeTool], tool_choice: { type: 'function', function: { name: 'get_time' } },
  });
  assert.equal(named.choices[0].message.tool_calls[0].function.name, 'get_time');
  const required = await openai.chat.completions.create({ model: 'muse-fake', messages: user('hello'), tools: [timeTool], tool_choice: 'required' });
  assert.equal(required.choices[0].finish_reason, 'tool_calls');
  const none = await openai.chat.completions.create({ model: 'muse-fake', messages: user('what is the weather'), tools: [weatherTool], tool_choice: 'none' });
  assert.equal(none.choices[0].message.tool_calls, undefined);
});

test('reasoning_effort and chat_template_kwargs reach the template', async () => {
  const count = async (extra) => (await (await fetch(base + '/tokenize', {
    method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' }, body: JSON.stringify({ messages: user('hi'), ...extra }),
  })).json()).count;
  const plain = await count({});
  assert.notEqual(await count({ reasoning_effort: 'low' }), plain);
  assert.notEqual(await count({ reasoning_effort: 'xhigh' }), await count({ reasoning_effort: 'low' }));
  const bad = await post('/v1/chat/completions', JSON.stringify({ messages: user('hi'), chat_template_kwargs: { raise_exception: 'template says no' } }));
  assert.equal(bad.status, 400);
  assert.match(bad.json.error.message, /template says no/);
});

test('logprobs and top_logprobs', async () => {
  const r = await openai.chat.completions.create({ model: 'muse-fake', messages: user('echo: ab'), logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.ok(lp.length > 0);
  for (const t of lp) {
    assert.equal(typeof t.logprob, 'number');
    assert.equal(t.top_logprobs.length, 3);
    assert.ok(Array.isArray(t.bytes));
  }
  const c = await openai.completions.create({ model: 'muse-fake', prompt: 'echo: xyz', logprobs: 2, max_tokens: 3 });
  assert.equal(c.choices[0].logprobs.tokens.length, 3);
  assert.equal(c.choices[0].logprobs.token_logprobs.length, 3);
});

test('seeds: same seed, same output; greedy is deterministic', async () => {
  const ask = (extra) => openai.chat.completions.create({ model: 'muse-fake', messages: user('tell me something'), max_tokens: 80, ...extra })
    .then((r) => r.choices[0].message.content);
  assert.equal(await ask({ temperature: 0.8, seed: 42 }), await ask({ temperature: 0.8, seed: 42 }));
  assert.equal(await ask({ temperature: 0 }), await ask({ temperature: 0 }));
  const outs = new Set();
  for (const seed of [1, 2, 3, 4]) outs.add(await ask({ temperature: 1, seed }));
  assert.ok(outs.size > 1, 'different seeds give different outputs');
});

test('stop strings are never leaked, across token boundaries', async () => {
  const pad = 'x'.repeat(40);
  const r = await openai.chat.completions.create({ model: 'muse-fake', messages: user(`echo: ${pad} one two STOP three`), stop: ['STOP'] });
  assert.equal(r.choices[0].message.content, `${pad} one two `);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const chunks = await collect(await openai.completions.create({ model: 'muse-fake', prompt: 'echo: alpha beta gamma', stop: ['ta g'], stream: true }));
  assert.equal(chunks.map((c) => c.choices[0]?.text ?? '').join(''), 'alpha be');
});

test('n > 1: distinct indices; sampled choices differ', async () => {
  const r = await openai.chat.completions.create({ model: 'muse-fake', messages: user('tell me'), n: 3, temperature: 1, seed: 9, max_tokens: 60 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.ok(new Set(r.choices.map((c) => c.message.content)).size > 1);
  const chunks = await collect(await openai.chat.completions.create({ model: 'muse-fake', messages: user('tell me'), n: 2, stream: true, max_tokens: 20 }));
  const finishes = chunks.flatMap((c) => c.choices).filter((c) => c.finish_reason).map((c) => c.index).sort();
  assert.deepEqual(finishes, [0, 1]);
});

test('completions: text, echo, token-id prompts, usage', async () => {
  const r = await openai.completions.create({ model: 'muse-fake', prompt: 'echo: plain text', max_tokens: 50 });
  assert.equal(r.choices[0].text, 'plain text');
  assert.equal(r.object, 'text_completion');
  const e = await openai.completions.create({ model: 'muse-fake', prompt: 'echo: hi', max_tokens: 2, echo: true });
  assert.ok(e.choices[0].text.startsWith('echo: hi'));
  const ids = [...Buffer.from('echo: ids')];
  const t = await openai.completions.create({ model: 'muse-fake', prompt: ids, max_tokens: 10 });
  assert.equal(t.choices[0].text, 'ids');
  assert.equal(t.usage.prompt_tokens, ids.length);
});

test('anthropic messages: thinking + text, usage', async () => {
  const m = await anthropic.messages.create({ model: 'muse-fake', max_tokens: 200, messages: user('echo: bonjour') });
  assert.equal(m.type, 'message');
  assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(m.content[1].text, 'bonjour');
  assert.equal(m.stop_reason, 'end_turn');
  assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens > 0);
  const cut = await anthropic.messages.create({ model: 'muse-fake', max_tokens: 5, messages: user('hello') });
  assert.equal(cut.stop_reason, 'max_tokens');
  const stopped = await anthropic.messages.create({ model: 'muse-fake', max_tokens: 200, messages: user('echo: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa b END c'), stop_sequences: ['END'] });
  assert.equal(stopped.stop_reason, 'stop_sequence');
  assert.equal(stopped.stop_sequence, 'END');
});

test('anthropic tool use, whole and streamed (input_json_delta)', async () => {
  const tools = [{ name: 'get_weather', description: 'Weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
  const m = await anthropic.messages.create({ model: 'muse-fake', max_tokens: 300, messages: user('weather please'), tools });
  assert.equal(m.stop_reason, 'tool_use');
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.deepEqual(use.input, { city: 'Paris' });
  assert.ok(use.id.startsWith('toolu_'));

  const stream = anthropic.messages.stream({ model: 'muse-fake', max_tokens: 300, messages: user('weather please'), tools });
  const types = [];
  stream.on('streamEvent', (e) => types.push(e.type === 'content_block_delta' ? e.delta.type : e.type));
  const final = await stream.finalMessage();
  assert.ok(types.includes('input_json_delta'));
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.deepEqual(final.content.find((b) => b.type === 'tool_use').input, { city: 'Paris' });
  assert.equal(final.stop_reason, 'tool_use');
  // A tool result continues the conversation (it must answer that turn's
  // tool_use id: Anthropic refuses an unanswered or unknown one).
  const finalUse = final.content.find((b) => b.type === 'tool_use');
  const next = await anthropic.messages.create({
    model: 'muse-fake', max_tokens: 300, tools,
    messages: [...user('weather please'), { role: 'assistant', content: final.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: finalUse.id, content: '18C' }] }],
  });
  assert.equal(next.stop_reason, 'end_turn');
});

test('SDK error classes: 404 unknown model, 401 bad key, 400 context length', async () => {
  await assert.rejects(openai.chat.completions.create({ model: 'nope', messages: user('hi') }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found' && /muse-fake/.test(e.message));
  const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  await assert.rejects(openai.chat.completions.create({ model: 'muse-fake', messages: user('hi'), max_tokens: 5000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded');
  const badA = new Anthropic({ baseURL: base, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(badA.messages.create({ model: 'muse-fake', max_tokens: 5, messages: user('hi') }), (e) => e instanceof Anthropic.AuthenticationError);
  await assert.rejects(anthropic.messages.create({ model: 'nope', max_tokens: 5, messages: user('hi') }), (e) => e instanceof Anthropic.NotFoundError);
});

// Raw HTTP: every bad input of server-api.md §3.3, status and envelope.
const post = (path, body, headers = {}) => postRaw(base, KEY, path, body, headers);

test('raw HTTP: every bad input gets its status and the OpenAI envelope', async () => {
  const msgs = '"messages":[{"role":"user","content":"hi"}]';
  const cases = [
    ['malformed JSON', '{"messages": [', 400, 'invalid_json'],
    ['not an object', '[1,2,3]', 400, 'invalid_json'],
    ['invalid UTF-8', Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xc3, 0x28]), Buffer.from('"}]}')]), 400, 'invalid_encoding'],
    ['wrong type', `{${msgs},"temperature":"hot"}`, 400, 'invalid_type'],
    ['wrong type (messages)', '{"messages":{"role":"user"}}', 400, 'invalid_type'],
    ['absurd n', `{${msgs},"n":1000000000}`, 400, 'invalid_value'],
    ['absurd temperature', `{${msgs},"temperature":1e308}`, 400, 'invalid_value'],
    ['negative max_tokens', `{${msgs},"max_tokens":-1}`, 400, 'invalid_value'],
    ['absurd top_logprobs', `{${msgs},"logprobs":true,"top_logprobs":100000}`, 400, 'invalid_value'],
    ['top_p zero', `{${msgs},"top_p":0}`, 400, 'invalid_value'],
    ['unknown model', `{"model":"gpt-9",${msgs}}`, 404, 'model_not_found'],
    ['prompt + max_tokens beyond context', `{${msgs},"max_tokens":2048}`, 400, 'context_length_exceeded'],
    ['prompt beyond context', `{"messages":[{"role":"user","content":"${'y'.repeat(3000)}"}]}`, 400, 'context_length_exceeded'],
    ['oversized body', `{${msgs},"pad":"${'z'.repeat(2 << 20)}"}`, 413, 'request_too_large'],
  ];
  for (const [name, body, status, code] of cases) {
    const r = await post('/v1/chat/completions', body);
    assert.equal(r.status, status, `${name}: ${r.text.slice(0, 300)}`);
    assert.equal(typeof r.json?.error?.message, 'string', name);
    assert.equal(typeof r.json.error.type, 'string', name);
    assert.ok('param' in r.json.error, name);
    assert.equal(r.json.error.code, code, name);
  }
  const noKey = await post('/v1/chat/completions', `{${msgs}}`, { authorization: 'Bearer nope' });
  assert.equal(noKey.status, 401);
  assert.equal(noKey.json.error.code, 'invalid_api_key');
  const health = await fetch(base + '/health');
  assert.equal(health.status, 200, '/health needs no key');
  const metrics = await fetch(base + '/metrics', { headers: { authorization: `Bearer ${KEY}` } });
  assert.match(await metrics.text(), /muse:num_requests_running\{model_name="muse-fake"\}/);
});

test('raw HTTP: Anthropic envelope on /v1/messages', async () => {
  const cases = [
    ['malformed JSON', '{', 400, 'invalid_request_error'],
    ['missing max_tokens', '{"messages":[{"role":"user","content":"hi"}]}', 400, 'invalid_request_error'],
    ['unknown model', '{"model":"x","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}', 404, 'not_found_error'],
    ['oversized body', `{"pad":"${'z'.repeat(2 << 20)}"}`, 413, 'request_too_large'],
  ];
  for (const [name, body, status, type] of cases) {
    const r = await post('/v1/messages', body);
    assert.equal(r.status, status, name);
    assert.equal(r.json.type, 'error', name);
    assert.equal(r.json.error.type, type, name);
  }
  const bad = await post('/v1/messages', '{}', { authorization: '', 'x-api-key': 'nope' });
  assert.equal(bad.status, 401);
  assert.equal(bad.json.error.type, 'authentication_error');
});
