// An agent on the TypeScript MCP SDK, for bench/mcpts/run.sh: each scenario
// drives gateway.mjs either directly or through CubeProxy and prints one JSON
// line; `cmp` holds what must be the same both ways, `info` what may differ.
//
//   node agent.mjs direct|proxy [scenario ...]   one line per scenario
//   node agent.mjs compare FILE                   direct against proxy
//
// env: PROXY (host:port of instance A), ALT_IP (instance B: same port, the
// address sandbox hosts resolve to once A drains, as a load balancer would
// send new connections), DIRECT (the gateway), PROXY_PID (A, for the drain
// scenarios), TRAFFIC_TOKEN, N (concurrent sessions).
import { Agent, setGlobalDispatcher } from 'undici';
import { readFileSync } from 'node:fs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js';
import { LoggingMessageNotificationSchema, ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

// No wildcard DNS here: sandbox hostnames resolve to the proxy, so the URL
// (and the Host header) stay what a real agent sends.
let target = '127.0.0.1';
setGlobalDispatcher(new Agent({ connect: { lookup: (h, o, cb) => o && o.all ? cb(null, [{ address: target, family: 4 }]) : cb(null, target, 4) } }));

const mode = process.argv[2];
const PROXY = process.env.PROXY || '127.0.0.1:18180';
const base = mode === 'proxy' ? `http://50005-tsb.cube.test:${PROXY.split(':')[1]}` : `http://${process.env.DIRECT || '127.0.0.1:50005'}`;
const headers = { Authorization: 'Bearer gw-secret' };
if (mode === 'proxy') headers['cube-traffic-access-token'] = process.env.TRAFFIC_TOKEN;
const sleep = (ms) => new Promise(r => setTimeout(r, ms));
const short = (e) => String(e).slice(0, 90);

// tracer wraps fetch: it records each request and can cut a response body
// after a number of progress events, as a dropped connection would.
function tracer(cut) {
  const seen = [];
  let getOpen; const gotGet = new Promise(r => getOpen = r);
  const f = async (url, init = {}) => {
    const m = init.method || 'GET';
    const body = typeof init.body === 'string' ? init.body : '';
    const rec = { m, lastEventId: new Headers(init.headers).get('last-event-id') };
    seen.push(rec);
    const res = await fetch(url, init);
    rec.status = res.status;
    if (m === 'GET' && res.ok) getOpen(res);
    if (cut && res.body && cut.match(m, body)) {
      const reader = res.body.getReader(); let n = 0; const dec = new TextDecoder();
      return new Response(new ReadableStream({
        async pull(c) {
          const { value, done } = await reader.read();
          if (done) { c.close(); return; }
          c.enqueue(value);
          n += (dec.decode(value).match(/notifications\/progress/g) || []).length;
          if (n >= cut.after) { cut.match = () => false; await reader.cancel(); c.error(new Error('cut by the test')); }
        }, cancel(r) { return reader.cancel(r); },
      }), { status: res.status, headers: res.headers });
    }
    return res;
  };
  return { f, seen, gotGet };
}

async function connect(opts = {}) {
  const t = tracer(opts.cut);
  const transport = new StreamableHTTPClientTransport(new URL(base + '/mcp'), {
    requestInit: { headers }, fetch: t.f,
    reconnectionOptions: { initialReconnectionDelay: 200, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1.5, maxRetries: opts.maxRetries ?? 2 },
  });
  const errors = [];
  transport.onerror = (e) => errors.push(short(e));
  const client = new Client({ name: 'ts-agent', version: '1' }, { capabilities: { elicitation: {} } });
  client.setRequestHandler(ElicitRequestSchema, async () => ({ action: 'accept', content: { name: 'agent' } }));
  const notes = [];
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => notes.push(n.params.data));
  await client.connect(transport);
  return { client, transport, t, errors, notes };
}

async function count(client, n, stepMs, extra = {}) {
  const prog = []; const t0 = Date.now();
  const r = await client.callTool({ name: 'count', arguments: { n, stepMs } }, undefined, {
    onprogress: (p) => prog.push([p.progress, Date.now() - t0]), timeout: 120000, resetTimeoutOnProgress: true, ...extra });
  return { text: r.content[0].text, prog, ms: Date.now() - t0 };
}

const text = (r) => r.content[0].text;
const failed = (p) => p.then(x => x, e => ({ text: 'ERR ' + short(e), prog: [] }));

// streams asks the proxy's admin API how many streams it holds.
async function streams() {
  if (mode !== 'proxy') return '-';
  const h = await (await fetch(`http://127.0.0.1:${Number(PROXY.split(':')[1]) + 1}/admin/healthz`)).json();
  return h.streams;
}

const scenarios = {
  // initialize, tools/list, tools/call (progress streamed), what the gateway sees, DELETE.
  async basic() {
    const { client, transport, t } = await connect();
    const tools = (await client.listTools()).tools.map(x => x.name).sort().join(',');
    const echo = text(await client.callTool({ name: 'echo', arguments: { text: 'héllo' } }));
    const hdr = JSON.parse(text(await client.callTool({ name: 'headers', arguments: {} })));
    const c = await count(client, 5, 300);
    await transport.terminateSession();
    let after;
    try { await client.callTool({ name: 'echo', arguments: { text: 'x' } }); after = 'answered'; } catch { after = 'refused'; }
    await client.close();
    return { cmp: { tools, echo, bearerSeen: hdr.authorization === headers.Authorization, trafficTokenSeen: 'cube-traffic-access-token' in hdr,
      count: c.text, progress: c.prog.length, streamed: c.prog[0][1] < c.ms - 900, delete: t.seen.find(s => s.m === 'DELETE')?.status, afterDelete: after },
    info: { firstProgressMs: c.prog[0][1], callMs: c.ms } };
  },
  // the standalone GET stream carries a notification the server sends on its own.
  async standalone() {
    const { client, t, notes } = await connect();
    const get = await Promise.race([t.gotGet, sleep(3000).then(() => null)]);
    await client.setLoggingLevel('debug');
    await client.callTool({ name: 'notify', arguments: { text: 'ping' } });
    for (const dl = Date.now() + 3000; !notes.includes('ping') && Date.now() < dl;) await sleep(20);
    await client.close();
    return { cmp: { get: get?.status, type: get?.headers.get('content-type'), note: notes.join(',') } };
  },
  // the client's connection drops mid-call: it resumes with GET + Last-Event-ID.
  async resumeAfterCut() {
    const cut = { after: 2, match: (m, b) => m === 'POST' && b.includes('"count"') };
    const { client, t, errors } = await connect({ cut, maxRetries: 5 });
    const c = await count(client, 6, 400);
    await client.close();
    return { cmp: { count: c.text, progress: c.prog.map(p => p[0]).join(','), resumed: t.seen.filter(s => s.m === 'GET' && s.lastEventId).map(s => s.status).join(',') }, info: { errors } };
  },
  // the gateway closes the call's stream mid-call (SSE polling); the client resumes.
  async polling() {
    const { client, t } = await connect({ maxRetries: 5 });
    const prog = [];
    const r = await client.callTool({ name: 'poll', arguments: {} }, undefined, { onprogress: (p) => prog.push(p.progress) });
    await client.close();
    return { cmp: { text: text(r), progress: prog.join(','), resumed: t.seen.filter(s => s.m === 'GET' && s.lastEventId).map(s => s.status).join(',') } };
  },
  // longer than every client and upstream timeout of the lab config (run.sh)
  async longCall() {
    const { client, errors, t } = await connect();
    const c = await count(client, 9, 1500); // 12 s, progress every 1.5 s
    const s = text(await client.callTool({ name: 'silent', arguments: { ms: 3500 } })); // silent past response_header_timeout
    await sleep(5500); // keep-alive connections idle past client.idle_timeout
    const e = text(await client.callTool({ name: 'echo', arguments: { text: 'after idle' } }));
    await client.close();
    // The GET stream, silent past upstream.idle_timeout, is cut and reopened through the proxy.
    return { cmp: { count: c.text, progress: c.prog.length, silent: s, afterIdle: e }, info: { errors, gets: t.seen.filter(s => s.m === 'GET').map(s => s.status).join(',') } };
  },
  // large answers (SSE events of up to 8 MiB) and a 3 MiB call.
  async big() {
    const { client } = await connect();
    const out = [];
    for (const n of [70000, 1 << 20, 8 << 20]) out.push(text(await client.callTool({ name: 'big', arguments: { bytes: n } })).length === n);
    out.push(text(await client.callTool({ name: 'size', arguments: { text: 'y'.repeat(3 << 20) } }, undefined, { timeout: 60000 })));
    await client.close();
    return { cmp: { out: out.join(',') } };
  },
  // a server-initiated request (elicitation) answered while the call's stream is open.
  async elicit() {
    const { client } = await connect();
    const r = text(await client.callTool({ name: 'ask', arguments: {} }));
    await client.close();
    return { cmp: { r } };
  },
  // the agent cancels a call, then closes with one in flight: nothing stays open.
  async cancel() {
    const { client } = await connect();
    const ac = new AbortController(); const prog = [];
    let res;
    try {
      await client.callTool({ name: 'count', arguments: { n: 30, stepMs: 300 } }, undefined,
        { signal: ac.signal, onprogress: (p) => { prog.push(p.progress); if (p.progress === 2) ac.abort('stop'); } });
      res = 'finished';
    } catch (e) { res = short(e); }
    const e = text(await client.callTool({ name: 'echo', arguments: { text: 'still' } }));
    const p = failed(count(client, 30, 300));
    await sleep(900);
    await client.close();
    const r = await p;
    for (const dl = Date.now() + 5000; Date.now() < dl && await streams() !== 0;) await sleep(50);
    return { cmp: { res, progress: prog.length, echo: e, closedMidCall: r.text.slice(0, 30) }, info: { streamsAfterClose: await streams() } };
  },
  async concurrent() {
    const N = Number(process.env.N || 50);
    const res = await Promise.allSettled(Array.from({ length: N }, async (_, i) => {
      const { client } = await connect();
      const c = await count(client, 5, 150);
      const e = text(await client.callTool({ name: 'echo', arguments: { text: 's' + i } }));
      await client.close();
      return c.prog.length === 5 && c.text === 'counted 5' && e === 's' + i;
    }));
    return { cmp: { ok: res.filter(r => r.status === 'fulfilled' && r.value).length, of: N },
      info: { errors: res.filter(r => r.status === 'rejected').map(r => short(r.reason) + ' / ' + short(r.reason?.cause)).slice(0, 3) } };
  },
  async legacySSE() {
    const transport = new SSEClientTransport(new URL(base + '/sse'), { requestInit: { headers } });
    const client = new Client({ name: 'ts-agent-legacy', version: '1' });
    await client.connect(transport);
    const tools = (await client.listTools()).tools.length;
    const prog = []; const t0 = Date.now();
    const r = await client.callTool({ name: 'count', arguments: { n: 4, stepMs: 300 } }, undefined, { onprogress: () => prog.push(Date.now() - t0) });
    const ms = Date.now() - t0;
    await client.close();
    // The SDK drops the last progress at times (direct too): compare that some streamed.
    return { cmp: { tools, count: text(r), streamed: prog.length >= 3 && prog[0] < ms - 500 } };
  },
  // SIGTERM proxy A with a short and a long call in flight and the GET stream
  // open; new connections go to B. The long call outlives drain_timeout and
  // resumes on B with Last-Event-ID. Direct: the same calls, no drain.
  async drain() {
    const pid = mode === 'proxy' ? Number(process.env.PROXY_PID) : 0;
    const { client, t, errors, notes } = await connect({ maxRetries: 5 });
    await client.setLoggingLevel('debug');
    await Promise.race([t.gotGet, sleep(3000)]);
    const a = failed(count(client, 8, 300));
    const b = failed(count(client, 40, 300));
    await sleep(800);
    if (pid) { process.kill(pid, 'SIGTERM'); target = process.env.ALT_IP || '127.0.0.2'; }
    const calls = await Promise.allSettled(Array.from({ length: 8 }, (_, i) => client.callTool({ name: 'echo', arguments: { text: 'd' + i } })));
    const s = await a;
    await sleep(1500);
    await client.callTool({ name: 'notify', arguments: { text: 'after-drain' } });
    const l = await b;
    for (const dl = Date.now() + 3000; !notes.includes('after-drain') && Date.now() < dl;) await sleep(20);
    await client.close().catch(() => {});
    return { cmp: { short: s.text, shortProgress: s.prog.length, long: l.text, longProgress: l.prog.length, callsDuringDrain: calls.filter(c => c.status === 'fulfilled').length, note: notes.join(',') },
      info: { gets: t.seen.filter(s => s.m === 'GET').map(s => `${s.status ?? 'fail'}${s.lastEventId ? '+Last-Event-ID' : ''}`).join(','), errors } };
  },
  // HTTP+SSE: the answer comes on the GET stream, which is the session.
  async drainLegacy() {
    const pid = mode === 'proxy' ? Number(process.env.PROXY_PID) : 0;
    const transport = new SSEClientTransport(new URL(base + '/sse'), { requestInit: { headers } });
    const client = new Client({ name: 'ts-agent-legacy', version: '1' });
    await client.connect(transport);
    const p = client.callTool({ name: 'count', arguments: { n: 10, stepMs: 300 } }, undefined, { timeout: 15000 }).then(text, e => 'ERR ' + short(e));
    await sleep(800);
    if (pid) { process.kill(pid, 'SIGTERM'); target = process.env.ALT_IP || '127.0.0.2'; }
    const r = await p;
    await client.close().catch(() => {});
    return { cmp: { call: r } };
  },
};

if (mode === 'compare') {
  const rows = readFileSync(process.argv[3], 'utf8').trim().split('\n').map(l => JSON.parse(l));
  let bad = 0;
  for (const name of [...new Set(rows.map(r => r.scenario))]) {
    const d = rows.find(r => r.scenario === name && r.mode === 'direct');
    const p = rows.find(r => r.scenario === name && r.mode === 'proxy');
    const same = d && p && !d.failed && !p.failed && JSON.stringify(d.cmp) === JSON.stringify(p.cmp);
    if (!same) bad++;
    console.log(`${same ? 'same   ' : 'DIFFERS'} ${name.padEnd(15)} direct ${JSON.stringify(d?.failed ?? d?.cmp)}`);
    if (!same) console.log(`${' '.repeat(23)} proxy  ${JSON.stringify(p?.failed ?? p?.cmp)}`);
    if (p?.info) console.log(`${' '.repeat(23)} proxy info ${JSON.stringify(p.info)}`);
  }
  process.exit(bad ? 1 : 0);
}

const names = process.argv.slice(3).length ? process.argv.slice(3) : Object.keys(scenarios).filter(n => !n.startsWith('drain'));
for (const scenario of names) {
  let line;
  try { line = { scenario, mode, ...(await scenarios[scenario]()) }; }
  catch (e) { line = { scenario, mode, failed: String(e?.stack || e).split('\n').slice(0, 2).join(' | ') }; }
  console.log(JSON.stringify(line));
}
process.exit(0);
