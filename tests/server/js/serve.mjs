// Starts `muse serve` on a free loopback port for a node test file and stops
// it (SIGTERM, expecting exit 0). Only node built-ins: tests outside this
// folder import it by path.
import { spawn } from 'node:child_process';

export async function startServer(args, { timeoutMs = 60000 } = {}) {
  const bin = process.env.MUSE_BIN;
  if (!bin) throw new Error('MUSE_BIN is not set (run through tests/server/js/run.sh)');
  // MUSE_SERVE_EXTRA (a JSON list of arguments, test harness only): the same
  // tests with more serve flags, e.g. speculative decoding (tests/*/tests.cmake).
  const extra = process.env.MUSE_SERVE_EXTRA ? JSON.parse(process.env.MUSE_SERVE_EXTRA) : [];
  const child = spawn(bin, ['serve', '--host', '127.0.0.1', '--port', '0', ...args, ...extra], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log)), timeoutMs);
    child.stderr.on('data', (d) => {
      log += d;
      const m = /ready: http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited ${code}:\n${log}`)); });
  });
  const exited = new Promise((r) => child.on('exit', (code, signal) => r({ code, signal })));
  return {
    base: `http://127.0.0.1:${port}`,
    log: () => log,
    async stop() {
      child.kill('SIGTERM');
      return exited;
    },
  };
}

// A raw POST (the body exactly as given, for the bad-input tables): status,
// the parsed JSON body or null, and the text.
export async function postRaw(base, key, path, body, headers = {}) {
  const res = await fetch(base + path, { method: 'POST', body, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...headers } });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text };
}
