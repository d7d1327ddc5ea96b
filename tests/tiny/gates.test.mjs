// The quality gates of seed 000 (issue 5), through the running server on the
// CPU backend with the official `openai` npm client, on the embedded model
// (models/muse-tiny, started with no MODEL argument):
//   1. a chat question gets a coherent, on-topic answer;
//   2. a request with a declared tool yields a parsed call to it with valid arguments;
//   3. a four-turn tool conversation (call, result, answer, follow-up) completes;
//   4. the same greedy request twice gives identical output.
// The prompts are ones the shipped checkpoint handles (docs/server.md, "Gate
// tests"); scripts/tiny/eval_gates.py measures pass rates over 100 varied prompts.
// Run by tests/server/js/run.sh (which provides MUSE_BIN and the npm packages).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { startServer } from '../server/js/serve.mjs';

// The npm packages live with the server's client tests.
const require = createRequire(new URL('../server/js/package.json', import.meta.url));
const { OpenAI } = require('openai');

let server, openai;

before(async () => {
  server = await startServer(['--max-num-seqs', '8', '--kv-cache-memory-bytes', '64M', '--disable-log-requests']);
  openai = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  if (server) assert.equal((await server.stop()).code, 0);
});

const weather = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Get the current weather for a city.',
    parameters: { type: 'object', properties: { city: { type: 'string', description: 'City name' } }, required: ['city'] },
  },
};
const calculator = {
  type: 'function',
  function: {
    name: 'calculator', description: 'Evaluate an arithmetic expression.',
    parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] },
  },
};
const greedy = { model: 'muse-tiny', temperature: 0, max_tokens: 200 };

// Arguments valid for the declared schema: an object, every required
// property present with the declared type, nothing undeclared.
function assertValidArguments(call, tools) {
  const tool = tools.find((t) => t.function.name === call.function.name);
  assert.ok(tool, `the call names a declared tool (got ${call.function.name})`);
  const args = JSON.parse(call.function.arguments);
  assert.equal(typeof args, 'object');
  const schema = tool.function.parameters;
  for (const key of schema.required ?? []) assert.ok(key in args, `required argument ${key}`);
  for (const [key, value] of Object.entries(args)) {
    assert.ok(key in schema.properties, `declared argument ${key}`);
    assert.equal(typeof value, schema.properties[key].type === 'string' ? 'string' : typeof value);
    if (typeof value === 'string') assert.ok(value.trim().length > 0, `non-empty ${key}`);
  }
  return args;
}

test('gate 1: a chat question gets a coherent on-topic answer', async () => {
  const r = await openai.chat.completions.create({ ...greedy, messages: [{ role: 'user', content: 'What color is the sky?' }] });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'stop', 'the answer ends by itself');
  assert.equal(m.tool_calls, undefined);
  assert.match(m.content, /\bblue\b/i, `on topic: ${m.content}`);
  assert.match(m.content, /^[A-Z][^<>]*[.!]$/, `one well-formed sentence or more: ${m.content}`);
});

test('gate 2: a declared tool yields a parsed tool call with valid arguments', async () => {
  const tools = [weather, calculator];
  const r = await openai.chat.completions.create({ ...greedy, tools, messages: [{ role: 'user', content: "What's the weather in Paris?" }] });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  const calls = r.choices[0].message.tool_calls;
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, 'get_weather');
  assertValidArguments(calls[0], tools);
});

test('gate 3: a four-turn tool conversation (call, result, answer, follow-up) completes', async () => {
  const tools = [weather];
  const messages = [{ role: 'user', content: "What's the weather in Paris?" }];
  const step = async () => {
    const r = await openai.chat.completions.create({ ...greedy, tools, messages });
    const m = r.choices[0].message;
    messages.push({ role: 'assistant', content: m.content, tool_calls: m.tool_calls });
    return { m, finish: r.choices[0].finish_reason };
  };
  const result = (call, city, temperature, condition) =>
    messages.push({ role: 'tool', tool_call_id: call.id, content: JSON.stringify({ city, temperature_c: temperature, condition }) });

  // Turn 1: the call.
  let { m, finish } = await step();
  assert.equal(finish, 'tool_calls');
  const args = JSON.parse(m.tool_calls[0].function.arguments);
  assert.equal(typeof args, 'object');
  // Turn 2: the result, then an answer in words.
  result(m.tool_calls[0], args.city ?? 'Paris', 18, 'sunny');
  ({ m, finish } = await step());
  assert.equal(finish, 'stop');
  assert.ok(m.content && m.content.length > 0, 'an answer after the tool result');
  assert.equal(m.tool_calls, undefined);
  // Turn 3: a follow-up; turn 4: its call and result, or a direct answer.
  messages.push({ role: 'user', content: 'What about Berlin?' });
  ({ m, finish } = await step());
  if (finish === 'tool_calls') {
    JSON.parse(m.tool_calls[0].function.arguments);
    result(m.tool_calls[0], 'Berlin', 12, 'cloudy');
    ({ m, finish } = await step());
  }
  assert.equal(finish, 'stop');
  assert.ok(m.content && m.content.length > 0, 'the conversation ends with an answer');
});

test('gate 4: the same greedy request twice gives identical output', async () => {
  for (const body of [{ messages: [{ role: 'user', content: 'What color is the sky?' }] },
    { messages: [{ role: 'user', content: "What's the weather in Paris?" }], tools: [weather, calculator] }]) {
    const a = await openai.chat.completions.create({ ...greedy, ...body });
    const b = await openai.chat.completions.create({ ...greedy, ...body });
    const strip = (r) => JSON.stringify(r.choices.map((c) => ({ ...c.message, tool_calls: c.message.tool_calls?.map((t) => t.function) })));
    assert.equal(strip(a), strip(b));
    assert.deepEqual(a.usage, b.usage);
  }
});
