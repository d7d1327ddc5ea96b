// The official `openai` and `@anthropic-ai/sdk` clients against `muse serve`
// on the REAL engine and the embedded model (models/muse-tiny, no MODEL
// argument: the default). The model is small, so assertions are about
// structure and about the server's own guarantees (streaming equals the whole
// response, greedy is deterministic, stop strings cut exactly, seeds repeat),
// not about what the model says. Run by tests/server/js/run.sh.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, postRaw } from './serve.mjs';

const KEY = 'test-key';
const MODEL = 'muse-tiny';
let server, base, openai, anthropic;

before(async () => {
  server = await startServer(['--served-model-name', `${MODEL},muse-alias`, '--api-key', KEY, '--max-model-len', '2048',
    '--max-request-body-mb', '1', '--max-num-seqs', '16', '--kv-cache-memory-bytes', '64M', '--disable-log-requests']);
  base = server.base;
  openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: base, apiKey: KEY, maxRetries: 0 });
});

after(async () => {
  if (!server) return;
  const { code } = await server.stop();
  assert.equal(code, 0, 'muse serve exits 0 on SIGTERM');
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Get the current weather for a city.',
    parameters: { type: 'object', properties: { city: { type: 'string', description: 'City name' } }, required: ['city'] },
  },
};
const calcTool = {
  type: 'function',
  function: {
    name: 'calculator', description: 'Evaluate an arithmetic expression.',
    parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] },
  },
};
const user = (content) => [{ role: 'user', content }];
const greedy = { model: MODEL, temperature: 0, max_tokens: 160 };

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

function assertToolCalls(message) {
  assert.ok(Array.isArray(message.tool_calls) && message.tool_calls.length > 0, 'tool calls');
  for (const c of message.tool_calls) {
    assert.equal(c.type, 'function');
    assert.ok(c.id.startsWith('call_'));
    assert.match(c.function.name, /^[A-Za-z0-9_.-]+$/);
    const args = JSON.parse(c.function.arguments);
    assert.equal(typeof args, 'object');
    assert.ok(args !== null && !Array.isArray(args));
  }
}

test('models lists the served names', async () => {
  const models = await openai.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [MODEL, 'muse-alias']);
});

test('chat: content, both reasoning fields, usage with reasoning tokens', async () => {
  const r = await openai.chat.completions.create({ ...greedy, messages: user('What color is the sky?') });
  const m = r.choices[0].message;
  assert.equal(r.object, 'chat.completion');
  assert.equal(m.role, 'assistant');
  assert.equal(typeof m.content, 'string');
  assert.ok(m.content.length > 0);
  assert.doesNotMatch(m.content, /<\|/, 'no framing marker leaks into content');
  assert.equal(typeof m.reasoning, 'string');
  assert.equal(m.reasoning_content, m.reasoning);
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens);
});

test('chat streaming equals the whole response; role first, usage chunk last', async () => {
  const body = { ...greedy, messages: user('What color is the sky?') };
  const whole = await openai.chat.completions.create(body);
  const chunks = await collect(await openai.chat.completions.create({ ...body, model: 'muse-alias', stream: true, stream_options: { include_usage: true } }));
  assert.deepEqual(chunks[0].choices[0].delta, { role: 'assistant', content: '' });
  let content = '', reasoning = '', finish = null;
  for (const c of chunks) for (const ch of c.choices) {
    content += ch.delta.content ?? '';
    reasoning += ch.delta.reasoning ?? '';
    assert.equal(ch.delta.reasoning_content ?? '', ch.delta.reasoning ?? '');
    finish = ch.finish_reason ?? finish;
  }
  assert.equal(content, whole.choices[0].message.content);
  assert.equal(reasoning, whole.choices[0].message.reasoning);
  assert.equal(finish, whole.choices[0].finish_reason);
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.deepEqual(last.usage, whole.usage);
  for (const c of chunks.slice(0, -1)) assert.equal(c.usage, null);
});

test('tools, streamed: argument deltas reassemble to valid JSON, same as the whole response', async () => {
  const body = { ...greedy, messages: user("What's the weather in Paris?"), tools: [weatherTool, calcTool] };
  const whole = await openai.chat.completions.create(body);
  assert.equal(whole.choices[0].finish_reason, 'tool_calls');
  assertToolCalls(whole.choices[0].message);
  const chunks = await collect(await openai.chat.completions.create({ ...body, stream: true }));
  const calls = {};
  let finish;
  for (const c of chunks) for (const ch of c.choices) {
    finish = ch.finish_reason ?? finish;
    for (const tc of ch.delta.tool_calls ?? []) {
      if (!calls[tc.index]) {
        assert.ok(tc.id && tc.type === 'function' && tc.function.name, 'the first delta names the call');
        calls[tc.index] = { name: tc.function.name, args: '' };
      } else {
        assert.equal(tc.id, undefined, 'id only once');
      }
      calls[tc.index].args += tc.function?.arguments ?? '';
    }
  }
  assert.equal(finish, 'tool_calls');
  const wholeCalls = whole.choices[0].message.tool_calls;
  assert.equal(Object.keys(calls).length, wholeCalls.length);
  wholeCalls.forEach((c, i) => {
    assert.equal(calls[i].name, c.function.name);
    assert.deepEqual(JSON.parse(calls[i].args), JSON.parse(c.function.arguments));
  });
});

test('tools: parallel_tool_calls=false keeps one call; tool_choice none gives text', async () => {
  const one = await openai.chat.completions.create({ ...greedy, messages: user("What's the weather in Paris?"), tools: [weatherTool], parallel_tool_calls: false });
  assert.ok((one.choices[0].message.tool_calls ?? []).length <= 1);
  const none = await openai.chat.completions.create({ ...greedy, messages: user("What's the weather in Paris?"), tools: [weatherTool], tool_choice: 'none' });
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.notEqual(none.choices[0].finish_reason, 'tool_calls');
});

// Forced choices are enforced by a grammar over the ATEM call syntax
// (chat/tool_call_grammar.h): even a question the model would answer in
// text yields a call, with the declared keys and required ones present.
test('tools: tool_choice named and required force a call (whole, streamed, sampled, Anthropic)', async () => {
  const sky = user('What color is the sky?');
  const named = await openai.chat.completions.create({ ...greedy, messages: sky, tools: [weatherTool, calcTool],
    tool_choice: { type: 'function', function: { name: 'calculator' } } });
  const nm = named.choices[0].message;
  assertToolCalls(nm);
  assert.equal(nm.tool_calls.length, 1);
  assert.equal(nm.tool_calls[0].function.name, 'calculator');
  assert.equal(typeof JSON.parse(nm.tool_calls[0].function.arguments).expression, 'string');
  assert.equal(nm.content, null);

  for (const temperature of [0, 1]) {
    const req = await openai.chat.completions.create({ ...greedy, temperature, seed: 7, messages: sky, tools: [weatherTool, calcTool], tool_choice: 'required' });
    const rm = req.choices[0].message;
    assertToolCalls(rm);
    for (const c of rm.tool_calls) {
      assert.ok(['get_weather', 'calculator'].includes(c.function.name), c.function.name);
      const args = JSON.parse(c.function.arguments);
      const key = c.function.name === 'get_weather' ? 'city' : 'expression';
      assert.deepEqual(Object.keys(args), [key]);
      assert.equal(typeof args[key], 'string');
    }
    assert.equal(req.choices[0].finish_reason, 'tool_calls');
  }

  const stream = await openai.chat.completions.create({ ...greedy, messages: sky, tools: [weatherTool, calcTool],
    tool_choice: { type: 'function', function: { name: 'calculator' } }, stream: true });
  const calls = {};
  for await (const c of stream) {
    for (const d of c.choices[0]?.delta?.tool_calls ?? []) {
      calls[d.index] ??= { name: '', args: '' };
      if (d.function?.name) calls[d.index].name += d.function.name;
      if (d.function?.arguments) calls[d.index].args += d.function.arguments;
    }
  }
  assert.equal(calls[0].name, 'calculator');
  assert.deepEqual(JSON.parse(calls[0].args), JSON.parse(nm.tool_calls[0].function.arguments));

  const a = await anthropic.messages.create({ model: MODEL, max_tokens: 200, temperature: 0, messages: sky,
    tools: [{ name: 'get_weather', description: 'Get the current weather for a city.',
      input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }],
    tool_choice: { type: 'tool', name: 'get_weather' } });
  assert.equal(a.stop_reason, 'tool_use');
  const use = a.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  assert.equal(typeof use.input.city, 'string');

  await assert.rejects(openai.chat.completions.create({ ...greedy, messages: sky, tools: [weatherTool], tool_choice: { type: 'function', function: { name: 'nope' } } }),
    (e) => e instanceof OpenAI.BadRequestError);
});

// Structured output: a grammar for compact JSON directed by the schema,
// applied to the answer body only (chat/json_schema_grammar.h).
test('response_format: json_object and json_schema answers parse and validate (whole, streamed, completions)', async () => {
  const sky = user('What color is the sky?');
  // (muse-tiny never saw JSON: with no schema it may ramble inside a string
  // until max_tokens; what it wrote is still an object's beginning.)
  const obj = await openai.chat.completions.create({ ...greedy, max_tokens: 200, messages: sky, response_format: { type: 'json_object' } });
  const text = obj.choices[0].message.content;
  assert.ok(text.startsWith('{'), text);
  if (obj.choices[0].finish_reason === 'stop') {
    const parsed = JSON.parse(text);
    assert.ok(parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed));
  } else {
    assert.equal(obj.choices[0].finish_reason, 'length');
  }

  const schema = { type: 'object', properties: { color: { type: 'string', enum: ['blue', 'red', 'green'] }, sure: { type: 'boolean' }, count: { type: 'integer' } },
    required: ['color', 'sure', 'count'], additionalProperties: false };
  const body = { ...greedy, max_tokens: 200, messages: sky, response_format: { type: 'json_schema', json_schema: { name: 'answer', schema } } };
  const r = await openai.chat.completions.create(body);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const v = JSON.parse(r.choices[0].message.content);
  assert.deepEqual(Object.keys(v).sort(), ['color', 'count', 'sure']);
  assert.ok(['blue', 'red', 'green'].includes(v.color));
  assert.equal(typeof v.sure, 'boolean');
  assert.ok(Number.isInteger(v.count));

  let streamed = '';
  for await (const c of await openai.chat.completions.create({ ...body, stream: true })) streamed += c.choices[0]?.delta?.content ?? '';
  assert.equal(streamed, r.choices[0].message.content);

  const sampled = await openai.chat.completions.create({ ...body, temperature: 1, seed: 3 });
  JSON.parse(sampled.choices[0].message.content);

  const comp = await openai.completions.create({ model: MODEL, prompt: 'The answer as JSON:', max_tokens: 60, temperature: 0, response_format: { type: 'json_object' } });
  if (comp.choices[0].finish_reason === 'stop') JSON.parse(comp.choices[0].text);
  else assert.equal(comp.choices[0].text[0], '{');

  await assert.rejects(openai.chat.completions.create({ ...body, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { anyOf: [{ type: 'string' }] } } } }),
    (e) => e instanceof OpenAI.BadRequestError && /anyOf/.test(e.message));
  await assert.rejects(openai.chat.completions.create({ ...body, tools: [weatherTool], tool_choice: 'required' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'tool_choice');
});

// The Responses API (/v1/responses), stateless: converted to the chat path,
// answered as reasoning / message / function_call items and typed events.
test('responses: whole and streamed (SDK stream helper), tools and a tool result, forced call, json_schema, errors', async () => {
  const base = { model: MODEL, temperature: 0, max_output_tokens: 160 };
  const r = await openai.responses.create({ ...base, input: 'What color is the sky?', instructions: 'Answer briefly.' });
  assert.equal(r.object, 'response');
  assert.ok(r.id.startsWith('resp_'));
  assert.equal(r.status, 'completed');
  assert.ok(r.output_text.length > 0, 'output_text');
  assert.deepEqual(r.output.map((i) => i.type).filter((t) => t !== 'reasoning'), ['message']);
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);

  const stream = openai.responses.stream({ ...base, input: 'What color is the sky?', instructions: 'Answer briefly.' });
  const seen = [];
  let text = '';
  stream.on('event', (e) => seen.push(e.type));
  stream.on('response.output_text.delta', (e) => { text += e.delta; });
  const final = await stream.finalResponse();
  const textOf = (resp) => resp.output.filter((i) => i.type === 'message').flatMap((i) => i.content).map((c) => c.text).join('');
  assert.equal(textOf(final), r.output_text);
  assert.deepEqual(final.output.map((i) => i.type), r.output.map((i) => i.type));
  assert.deepEqual(final.output.map((i) => i.status), r.output.map(() => 'completed'));
  const reasoningOf = (resp) => resp.output.filter((i) => i.type === 'reasoning').flatMap((i) => i.content).map((c) => c.text).join('');
  assert.equal(reasoningOf(final), reasoningOf(r));
  assert.equal(text, r.output_text);
  assert.equal(seen[0], 'response.created');
  assert.equal(seen.at(-1), 'response.completed');

  const tools = [{ type: 'function', name: 'get_weather', description: 'Get the current weather for a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const call = await openai.responses.create({ ...base, input: "What's the weather in Paris?", tools });
  const fc = call.output.find((i) => i.type === 'function_call');
  assert.ok(fc, 'a function_call item');
  assert.equal(fc.name, 'get_weather');
  assert.ok(fc.call_id.startsWith('call_'));
  assert.equal(typeof JSON.parse(fc.arguments).city, 'string');
  const next = await openai.responses.create({ ...base, tools, input: [
    { role: 'user', content: "What's the weather in Paris?" },
    ...call.output.filter((i) => i.type !== 'message'),
    { type: 'function_call_output', call_id: fc.call_id, output: '18 C and sunny' }] });
  assert.ok(['completed', 'incomplete'].includes(next.status));

  const forced = await openai.responses.create({ ...base, input: 'What color is the sky?', tools, tool_choice: { type: 'function', name: 'get_weather' } });
  assert.equal(forced.output.filter((i) => i.type === 'function_call').length, 1);

  const schema = { type: 'object', properties: { color: { type: 'string' } }, required: ['color'], additionalProperties: false };
  const js = await openai.responses.create({ ...base, input: 'What color is the sky?', text: { format: { type: 'json_schema', name: 'c', schema } } });
  assert.equal(typeof JSON.parse(js.output_text).color, 'string');

  await assert.rejects(openai.responses.create({ ...base, input: 'hi', previous_response_id: r.id }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id');
  await assert.rejects(openai.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(openai.responses.create({ ...base, input: [{ type: 'web_search_call' }] }), (e) => e instanceof OpenAI.BadRequestError);
});

test('a tool result continues the conversation', async () => {
  const first = await openai.chat.completions.create({ ...greedy, messages: user("What's the weather in Paris?"), tools: [weatherTool] });
  const m = first.choices[0].message;
  assertToolCalls(m);
  const next = await openai.chat.completions.create({
    ...greedy, tools: [weatherTool],
    messages: [...user("What's the weather in Paris?"), { role: 'assistant', content: m.content, tool_calls: m.tool_calls },
      { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '{"temperature_c": 18, "condition": "sunny"}' }],
  });
  const answer = next.choices[0].message;
  assert.ok((answer.content ?? '').length > 0 || (answer.tool_calls ?? []).length > 0);
});

test('reasoning_effort reaches the template', async () => {
  const tokens = async (extra) => JSON.stringify((await (await fetch(base + '/tokenize', {
    method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' }, body: JSON.stringify({ messages: user('hi'), ...extra }),
  })).json()).tokens);
  assert.notEqual(await tokens({ reasoning_effort: 'low' }), await tokens({ reasoning_effort: 'xhigh' }));
  assert.notEqual(await tokens({}), await tokens({ chat_template_kwargs: { reasoning_strength: 'low' } }));
});

test('logprobs: one entry per token, greedy picks the top one, bytes given', async () => {
  const r = await openai.chat.completions.create({ ...greedy, max_tokens: 12, messages: user('What color is the sky?'), logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    assert.equal(t.top_logprobs[0].logprob, t.logprob, 'greedy: the chosen token is the most likely');
    assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob && t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob);
    assert.ok(Array.isArray(t.bytes));
  }
  const c = await openai.completions.create({ model: MODEL, prompt: 'The sky is', logprobs: 2, max_tokens: 4, temperature: 0, ignore_eos: true });
  assert.equal(c.choices[0].logprobs.tokens.length, 4);
  assert.equal(c.choices[0].logprobs.token_logprobs.length, 4);
  const echo = await openai.completions.create({ model: MODEL, prompt: 'The sky is', logprobs: 1, max_tokens: 2, temperature: 0, echo: true, ignore_eos: true });
  const prompt = (await (await fetch(base + '/tokenize', { method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'The sky is' }) })).json()).count;
  assert.equal(echo.choices[0].logprobs.token_logprobs.length, prompt + 2);
  assert.equal(echo.choices[0].logprobs.token_logprobs[0], null);
});

test('seeds: same seed, same output; greedy repeats; different seeds differ', async () => {
  const ask = (extra) => openai.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 40, ignore_eos: true, ...extra })
    .then((r) => r.choices[0].text);
  assert.equal(await ask({ temperature: 0.8, seed: 42 }), await ask({ temperature: 0.8, seed: 42 }));
  assert.equal(await ask({ temperature: 0 }), await ask({ temperature: 0 }));
  const outs = new Set();
  for (const seed of [1, 2, 3, 4]) outs.add(await ask({ temperature: 1, seed }));
  assert.ok(outs.size > 1, 'different seeds give different outputs');
});

test('stop strings cut exactly, across token boundaries, whole and streamed', async () => {
  const body = { model: MODEL, prompt: 'The capital of France is', max_tokens: 40, temperature: 0, ignore_eos: true };
  const full = (await openai.completions.create(body)).choices[0].text;
  // A stop string that starts inside one token and ends inside another.
  const at = Math.floor(full.length / 2);
  const stop = full.slice(at, at + 5);
  const cut = full.slice(0, full.indexOf(stop));
  const r = await openai.completions.create({ ...body, stop: [stop] });
  assert.equal(r.choices[0].text, cut);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].stop_reason, stop);
  const chunks = await collect(await openai.completions.create({ ...body, stop: [stop], stream: true }));
  assert.equal(chunks.map((c) => c.choices[0]?.text ?? '').join(''), cut);
  const incl = await openai.completions.create({ ...body, stop: [stop], include_stop_str_in_output: true });
  assert.equal(incl.choices[0].text, cut + stop);
});

test('n > 1: distinct indices; sampled choices differ; streamed choices all finish', async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages: user('Tell me a story.'), n: 3, temperature: 1, seed: 9, max_tokens: 40 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.ok(new Set(r.choices.map((c) => JSON.stringify(c.message))).size > 1);
  const chunks = await collect(await openai.chat.completions.create({ model: MODEL, messages: user('Hello!'), n: 2, stream: true, max_tokens: 20 }));
  const finishes = chunks.flatMap((c) => c.choices).filter((c) => c.finish_reason).map((c) => c.index).sort();
  assert.deepEqual(finishes, [0, 1]);
});

test('completions: text, echo, token-id prompts, usage', async () => {
  const r = await openai.completions.create({ model: MODEL, prompt: 'The sky is', max_tokens: 8, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  const e = await openai.completions.create({ model: MODEL, prompt: 'The sky is', max_tokens: 2, echo: true, temperature: 0 });
  assert.ok(e.choices[0].text.startsWith('The sky is'));
  const ids = (await (await fetch(base + '/tokenize', { method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'The sky is' }) })).json()).tokens;
  const t = await openai.completions.create({ model: MODEL, prompt: ids, max_tokens: 8, temperature: 0 });
  assert.equal(t.choices[0].text, r.choices[0].text, 'token ids and text give the same completion');
  assert.equal(t.usage.prompt_tokens, ids.length);
});

test('anthropic messages: thinking + text blocks, usage, max_tokens, stop_sequences', async () => {
  const m = await anthropic.messages.create({ model: MODEL, max_tokens: 200, temperature: 0, messages: user('What color is the sky?') });
  assert.equal(m.type, 'message');
  const types = m.content.map((b) => b.type);
  assert.ok(types.includes('text'), types.join());
  assert.equal(types[0], 'thinking');
  assert.equal(m.stop_reason, 'end_turn');
  assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens > 0);
  const cut = await anthropic.messages.create({ model: MODEL, max_tokens: 5, messages: user('Hello!') });
  assert.equal(cut.stop_reason, 'max_tokens');
  const word = m.content.find((b) => b.type === 'text').text.split(' ').find((w) => w.length >= 3) ?? 'sky';
  const stopped = await anthropic.messages.create({ model: MODEL, max_tokens: 200, temperature: 0, messages: user('What color is the sky?'), stop_sequences: [word] });
  assert.equal(stopped.stop_reason, 'stop_sequence');
  assert.equal(stopped.stop_sequence, word);
});

test('anthropic tool use, whole and streamed (input_json_delta), then a tool result', async () => {
  const tools = [{ name: 'get_weather', description: 'Get the current weather for a city.', input_schema: weatherTool.function.parameters }];
  const body = { model: MODEL, max_tokens: 300, temperature: 0, messages: user("What's the weather in Paris?"), tools };
  const m = await anthropic.messages.create(body);
  assert.equal(m.stop_reason, 'tool_use');
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.ok(use.id.startsWith('toolu_'));
  assert.equal(typeof use.input, 'object');
  const stream = anthropic.messages.stream(body);
  const types = [];
  stream.on('streamEvent', (e) => types.push(e.type === 'content_block_delta' ? e.delta.type : e.type));
  const final = await stream.finalMessage();
  assert.ok(types.includes('input_json_delta'));
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.deepEqual(final.content.find((b) => b.type === 'tool_use').input, use.input);
  const next = await anthropic.messages.create({
    ...body, messages: [...user("What's the weather in Paris?"), { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18C and sunny' }] }],
  });
  assert.equal(next.type, 'message');
  assert.ok(['end_turn', 'tool_use', 'max_tokens'].includes(next.stop_reason));
});

test('a client that hangs up mid-stream cancels its request; the engine goes idle', async () => {
  const ctl = new AbortController();
  const stream = await openai.chat.completions.create({ model: MODEL, messages: user('Tell me a story.'), max_tokens: 1000, ignore_eos: true, stream: true }, { signal: ctl.signal });
  let n = 0;
  try {
    for await (const _ of stream) if (++n === 5) ctl.abort();
  } catch { /* aborted */ }
  assert.ok(n >= 5 && n < 50, `the stream stopped after the abort (${n} chunks)`);
  let metrics = '';
  for (let i = 0; i < 100; ++i) {
    metrics = await (await fetch(base + '/metrics', { headers: { authorization: `Bearer ${KEY}` } })).text();
    if (metrics.includes(`muse:num_requests_running{model_name="${MODEL}"} 0`)) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.match(metrics, new RegExp(`muse:num_requests_running\\{model_name="${MODEL}"\\} 0`));
  assert.match(metrics, /muse:http_requests_client_disconnected_total\{model_name="muse-tiny"\} [1-9]/);
  assert.match(metrics, /muse:kv_cache_usage_perc\{model_name="muse-tiny"\} 0\n/);
});

test('SDK error classes: 404 unknown model, 401 bad key, 400 context length', async () => {
  await assert.rejects(openai.chat.completions.create({ model: 'nope', messages: user('hi') }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found' && /muse-tiny/.test(e.message));
  const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: user('hi'), max_tokens: 5000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded');
  await assert.rejects(anthropic.messages.create({ model: 'nope', max_tokens: 5, messages: user('hi') }), (e) => e instanceof Anthropic.NotFoundError);
});

const post = (path, body, headers = {}) => postRaw(base, KEY, path, body, headers);

test('raw HTTP: every bad input gets its status and the OpenAI envelope', async () => {
  const msgs = '"messages":[{"role":"user","content":"hi"}]';
  const long = Array(3000).fill('hello').join(' ');
  const cases = [
    ['malformed JSON', '{"messages": [', 400, 'invalid_json'],
    ['not an object', '[1,2,3]', 400, 'invalid_json'],
    ['invalid UTF-8', Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xc3, 0x28]), Buffer.from('"}]}')]), 400, 'invalid_encoding'],
    ['wrong type', `{${msgs},"temperature":"hot"}`, 400, 'invalid_type'],
    ['wrong type (messages)', '{"messages":{"role":"user"}}', 400, 'invalid_type'],
    ['absurd n', `{${msgs},"n":1000000000}`, 400, 'invalid_value'],
    ['n above --max-num-seqs', `{${msgs},"n":100}`, 400, null],
    ['absurd temperature', `{${msgs},"temperature":1e308}`, 400, 'invalid_value'],
    ['negative max_tokens', `{${msgs},"max_tokens":-1}`, 400, 'invalid_value'],
    ['absurd top_logprobs', `{${msgs},"logprobs":true,"top_logprobs":100000}`, 400, 'invalid_value'],
    ['top_p zero', `{${msgs},"top_p":0}`, 400, 'invalid_value'],
    ['logit_bias outside the vocabulary', `{${msgs},"logit_bias":{"999999":5}}`, 400, null],
    ['unknown model', `{"model":"gpt-9",${msgs}}`, 404, 'model_not_found'],
    ['prompt + max_tokens beyond context', `{${msgs},"max_tokens":2048}`, 400, 'context_length_exceeded'],
    ['prompt beyond context', `{"messages":[{"role":"user","content":"${long}"}]}`, 400, 'context_length_exceeded'],
    ['oversized body', `{${msgs},"pad":"${'z'.repeat(2 << 20)}"}`, 413, 'request_too_large'],
  ];
  for (const [name, body, status, code] of cases) {
    const r = await post('/v1/chat/completions', body);
    assert.equal(r.status, status, `${name}: ${r.text.slice(0, 300)}`);
    assert.equal(typeof r.json?.error?.message, 'string', name);
    assert.equal(typeof r.json.error.type, 'string', name);
    assert.ok('param' in r.json.error, name);
    if (code) assert.equal(r.json.error.code, code, name);
  }
  const noKey = await post('/v1/chat/completions', `{${msgs}}`, { authorization: 'Bearer nope' });
  assert.equal(noKey.status, 401);
  assert.equal(noKey.json.error.code, 'invalid_api_key');
  const ids = await post('/v1/completions', '{"prompt":[1,2,999999],"max_tokens":2}');
  assert.equal(ids.status, 400, ids.text);
  const detok = await post('/detokenize', '{"tokens":[1,-5]}');
  assert.equal(detok.status, 400, detok.text);
  assert.equal((await fetch(base + '/health')).status, 200, '/health needs no key');
});
