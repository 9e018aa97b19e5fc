// An agent on the official TypeScript MCP SDK client, talking to a go-sdk
// gateway through CubeProxy. proxy/mcp_tsclient_test.go runs it and
// asserts on what it prints: one JSON object a line, each with an "ev".
//
//   node client.mjs URL
//
// URL is the proxy's traffic listener, http://127.0.0.1:PORT/mcp (with
// ?cube_token=... for a signed URL in place of the traffic token). Node's
// fetch sends no Host of the caller's (it drops the header) and resolves
// no *.localhost name, so the sandbox is chosen by the X-Cube-Sandbox-Id
// and X-Cube-Sandbox-Port headers. Environment:
//   TSMCP_SANDBOX_ID, TSMCP_SANDBOX_PORT  the target
//   TSMCP_TRAFFIC_TOKEN  the route's TrafficAccessToken (proxy's credential)
//   TSMCP_BEARER         the gateway's own Authorization value
//   TSMCP_SAMPLE_BYTES   size of the text the sampling handler answers
//   TSMCP_HEARTBEATS=1   wait for a heartbeat of the proxy's (an SSE
//                        comment) on the GET stream, and on the ack call's
//                        stream before answering its progress
//   TSMCP_JSON=1         the gateway answers calls as plain JSON
//                        (go-sdk JSONResponse): its progress, requests
//                        and notifications come on the standalone GET
//                        stream, and a call's answer, not being a stream,
//                        cannot be resumed, so the resume call is left out
//
// The gateway (see the Go test) has the tools: ack (progress, then waits
// for notifications/roots/list_changed), touch (adds a tool: the gateway
// sends tools/list_changed on the standalone GET stream; once the client
// has cut that stream, the gateway adds another, which the client gets on
// its Last-Event-ID GET), sample (asks the
// client for a sampling answer) and resume (progress, then waits until the
// gateway saw this call's POST cut; then progress and its result, which
// the client gets on its Last-Event-ID GET).

import diagnostics from 'node:diagnostics_channel';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  CreateMessageRequestSchema,
  ListRootsRequestSchema,
  ToolListChangedNotificationSchema,
} from '@modelcontextprotocol/sdk/types.js';

const url = process.argv[2];
const env = process.env;
const sampleBytes = Number(env.TSMCP_SAMPLE_BYTES || 20480);

function emit(o) {
  process.stdout.write(JSON.stringify(o) + '\n');
}

function deferred() {
  let resolve;
  const p = new Promise((r) => { resolve = r; });
  return { p, resolve };
}

// withTimeout bounds a wait that a broken proxy would make endless; the
// waits themselves are on events.
function withTimeout(p, ms, what) {
  let t;
  return Promise.race([
    p,
    new Promise((_, rej) => { t = setTimeout(() => rej(new Error(`timed out waiting for ${what}`)), ms); }),
  ]).finally(() => clearTimeout(t));
}

// The transport's fetch: it records every exchange (method, what it
// carries, status), how many are open at once (from the request until its
// body ends), and can cut a response's body as a client's dropped
// connection would.
let open = 0;
let heartbeats = 0;
const heartbeatLine = ': keep-alive';
// Node's fetch (undici) announces each TCP connection it opens.
let connections = 0;
diagnostics.subscribe('undici:client:connected', () => { connections++; });
let maxOpen = 0;
const exchanges = [];
const standaloneOpen = deferred();
let resumePost = null;
let ackPost = null;
let standalone = null;
const resumePostSeen = deferred();

function kindOf(method, body, headers) {
  if (method === 'GET') return headers.get('last-event-id') ? 'get-resume' : 'get';
  if (method === 'DELETE') return 'delete';
  try {
    const m = JSON.parse(body);
    if (m.method === 'tools/call') return `call:${m.params.name}`;
    if (m.method) return m.method;
    if ('result' in m || 'error' in m) return 'response';
  } catch { /* not JSON */ }
  return 'post';
}

async function tracedFetch(input, init = {}) {
  const method = init.method || 'GET';
  const headers = new Headers(init.headers);
  const body = typeof init.body === 'string' ? init.body : '';
  // What the request carried is known before the fetch: an exchange the
  // SDK aborts (its close cuts a POST whose 202 is still on the way) keeps it.
  const ex = {
    kind: kindOf(method, body, headers), method, bytes: body.length,
    protocolVersion: headers.get('mcp-protocol-version'), lastEventId: headers.get('last-event-id'),
  };
  // nextBeat: a promise of the next heartbeat the body brings.
  let beatWaiters = [];
  Object.defineProperty(ex, 'nextBeat', { value: () => new Promise((r) => beatWaiters.push(r)), enumerable: false });
  exchanges.push(ex);
  open++;
  maxOpen = Math.max(maxOpen, open);
  ex.openWith = open;
  let res;
  try {
    res = await fetch(input, init);
  } catch (e) {
    open--;
    emit({ ev: 'http', ...ex, error: String(e.cause?.message || e.message) });
    throw e;
  }
  ex.status = res.status;
  ex.contentType = res.headers.get('content-type');
  emit({ ev: 'http', ...ex });
  let isEnded = false;
  const end = () => { if (!isEnded) { isEnded = true; open--; } };
  if (!res.body) {
    end();
    return res;
  }
  const reader = res.body.getReader();
  let ctl;
  const stream = new ReadableStream({
    start(c) { ctl = c; },
    async pull(c) {
      try {
        const { value, done } = await reader.read();
        if (done) {
          end();
          c.close();
        } else {
          // The proxy writes a heartbeat alone, between two events.
          const n = Buffer.from(value).toString('latin1').split(heartbeatLine).length - 1;
          if (n > 0) {
            heartbeats += n;
            for (const r of beatWaiters) r();
            beatWaiters = [];
          }
          c.enqueue(value);
        }
      } catch (e) {
        end();
        try { c.error(e); } catch { /* cut already */ }
      }
    },
    cancel(reason) {
      end();
      return reader.cancel(reason);
    },
  });
  // cut drops the connection under the body, as an agent whose network
  // changed would: the SDK sees its stream fail.
  ex.cut = () => {
    end();
    ctl.error(new Error('cut by the test client'));
    reader.cancel('cut').catch(() => {});
  };
  if (ex.kind === 'get' && res.ok) {
    standalone = ex;
    standaloneOpen.resolve();
  }
  if (ex.kind === 'call:ack') ackPost = ex;
  if (ex.kind === 'call:resume') {
    resumePost = ex;
    resumePostSeen.resolve();
  }
  return new Response(stream, { status: res.status, statusText: res.statusText, headers: res.headers });
}

const transport = new StreamableHTTPClientTransport(new URL(url), {
  fetch: tracedFetch,
  requestInit: {
    // Those unset (no traffic token with a signed URL) are left out.
    headers: Object.fromEntries(Object.entries({
      'X-Cube-Sandbox-Id': env.TSMCP_SANDBOX_ID,
      'X-Cube-Sandbox-Port': env.TSMCP_SANDBOX_PORT,
      'Cube-Traffic-Access-Token': env.TSMCP_TRAFFIC_TOKEN,
      Authorization: env.TSMCP_BEARER,
    }).filter(([, v]) => v)),
  },
  // The SDK's own backoff for reconnecting a stream; a 429 on a resume
  // (a slot not yet given back) is retried on it too.
  reconnectionOptions: { initialReconnectionDelay: 20, maxReconnectionDelay: 2000, reconnectionDelayGrowFactor: 2, maxRetries: 10 },
});

const client = new Client({ name: 'ts-agent', version: '1.0.0' }, {
  capabilities: { sampling: {}, roots: { listChanged: true } },
});
const errors = [];
client.onerror = (e) => { errors.push(String(e.message || e)); };
let samplingRequests = 0;
client.setRequestHandler(CreateMessageRequestSchema, async () => {
  samplingRequests++;
  return { model: 'ts-model', role: 'assistant', content: { type: 'text', text: 'x'.repeat(sampleBytes) } };
});
client.setRequestHandler(ListRootsRequestSchema, async () => ({ roots: [] }));
const listChanged = [deferred(), deferred()];
let listChanges = 0;
client.setNotificationHandler(ToolListChangedNotificationSchema, async () => { listChanged[listChanges++]?.resolve(); });

const text = (res) => res.content.map((c) => c.text).join('');

async function main() {
  await client.connect(transport);
  emit({ ev: 'connected', sessionId: transport.sessionId, protocolVersion: transport.protocolVersion, server: client.getServerVersion() });
  await withTimeout(standaloneOpen.p, 20000, 'the standalone GET stream');
  emit({ ev: 'standalone-open' });
  const waitBeats = env.TSMCP_HEARTBEATS === '1';
  if (waitBeats) await withTimeout(standalone.nextBeat(), 20000, 'a heartbeat on the GET stream');

  const tools = await client.listTools();
  emit({ ev: 'tools', names: tools.tools.map((t) => t.name).sort() });

  // Streaming without sleeps: the tool reports progress and then waits for
  // a notification the client sends only once it has seen that progress.
  {
    const seen = [];
    const res = await client.callTool({ name: 'ack' }, undefined, {
      onprogress: (p) => {
        seen.push(p.message);
        if (p.progress !== 1) return;
        // With TSMCP_HEARTBEATS the call's stream stays silent until a
        // heartbeat has gone by between its two progress events.
        (waitBeats ? withTimeout(ackPost.nextBeat(), 20000, 'a heartbeat on the call stream') : Promise.resolve())
          .then(() => client.sendRootsListChanged())
          .catch((e) => errors.push(`roots: ${e.message}`));
      },
    });
    emit({ ev: 'ack', progress: seen, result: text(res) });
  }

  // A notification on the standalone GET stream.
  {
    const res = await client.callTool({ name: 'touch' });
    await withTimeout(listChanged[0].p, 20000, 'tools/list_changed');
    emit({ ev: 'list-changed', result: text(res) });
  }

  // The client drops its standalone GET stream; the SDK reconnects with
  // Last-Event-ID and gets what the gateway sent meanwhile.
  standalone.cut();
  await withTimeout(listChanged[1].p, 20000, 'tools/list_changed on the resumed GET stream');
  emit({ ev: 'standalone-resumed', gets: exchanges.filter((e) => e.kind.startsWith('get')).map((e) => ({ status: e.status, lastEventId: e.lastEventId })) });

  // The gateway asks for a sampling answer over 8 KiB while the call waits.
  {
    const res = await client.callTool({ name: 'sample' });
    emit({ ev: 'sample', result: text(res), requests: samplingRequests });
  }

  // Resumability: the client's connection under the call's answer drops
  // after the first progress; the SDK comes back with Last-Event-ID.
  if (env.TSMCP_JSON !== '1') {
    const seen = [];
    const call = client.callTool({ name: 'resume' }, undefined, {
      onprogress: (p) => {
        seen.push(p.message);
        if (p.progress === 1) resumePostSeen.p.then(() => resumePost.cut());
      },
    });
    const res = await call;
    emit({ ev: 'resume', progress: seen, result: text(res),
      resumes: exchanges.filter((e) => e.kind === 'get-resume' && !e.lastEventId.startsWith('_')).map((e) => ({ status: e.status, lastEventId: e.lastEventId })) });
  }

  // Session termination (DELETE), then the client's close.
  await transport.terminateSession();
  emit({ ev: 'terminated', sessionId: transport.sessionId ?? null });
  await client.close();

  const kinds = {};
  for (const e of exchanges) kinds[e.kind] = (kinds[e.kind] || 0) + 1;
  emit({ ev: 'pattern', maxOpen, connections, heartbeats, kinds, errors });
  emit({ ev: 'done' });
}

main().catch((e) => {
  emit({ ev: 'fatal', error: String(e.stack || e), errors });
  process.exit(1);
});
