// An agent on the official TypeScript MCP SDK's older HTTP+SSE transport
// (SSEClientTransport: a GET event stream that carries every answer, its
// first event "endpoint" naming the URL the client POSTs its messages to),
// talking to a go-sdk gateway (mcp.NewSSEHandler) through CubeProxy.
// proxy/mcp_tsclient_test.go runs it and asserts on what it prints: one
// JSON object a line, each with an "ev".
//
//   node legacy.mjs URL
//
// URL is the proxy's traffic listener, http://127.0.0.1:PORT/mcp, with
// ?cube_token=... for a signed URL in place of the traffic token. The
// sandbox is chosen by the X-Cube-Sandbox-Id and X-Cube-Sandbox-Port
// headers (see client.mjs). Environment:
//   TSMCP_SANDBOX_ID, TSMCP_SANDBOX_PORT  the target
//   TSMCP_TRAFFIC_TOKEN  the route's TrafficAccessToken (unset: signed URL)
//   TSMCP_BEARER         the gateway's own Authorization value
//   TSMCP_HEARTBEATS=1   wait for a heartbeat of the proxy's on the GET
//                        stream before the calls, and again between the
//                        ack call's two progress events
//
// With a signed URL the gateway announces its endpoint without the token
// (the proxy removed it before the gateway saw the URL), and the SDK
// resolves that endpoint against the URL it was given, query and all
// replaced: the client first connects as given (the POST of its initialize
// request is refused by the proxy: "plain" line), then with a fetch that
// puts the token back on every URL of the proxy's, which is what an agent
// must do.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js';
import { ListRootsRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const url = new URL(process.argv[2]);
const env = process.env;
const token = url.searchParams.get('cube_token');

function emit(o) {
  process.stdout.write(JSON.stringify(o) + '\n');
}

function withTimeout(p, ms, what) {
  let t;
  return Promise.race([
    p,
    new Promise((_, rej) => { t = setTimeout(() => rej(new Error(`timed out waiting for ${what}`)), ms); }),
  ]).finally(() => clearTimeout(t));
}

const headers = Object.fromEntries(Object.entries({
  'X-Cube-Sandbox-Id': env.TSMCP_SANDBOX_ID,
  'X-Cube-Sandbox-Port': env.TSMCP_SANDBOX_PORT,
  'Cube-Traffic-Access-Token': env.TSMCP_TRAFFIC_TOKEN,
  Authorization: env.TSMCP_BEARER,
}).filter(([, v]) => v));

// traced returns a fetch that records each exchange (method, the URL's
// query, status) in exchanges and counts the proxy's heartbeats in the
// GET stream; with keepToken it first puts the signed URL's token back on
// the URL, as an agent with a signed URL must for the announced endpoint.
function traced(exchanges, keepToken) {
  const state = { heartbeats: 0, waiters: [], pending: new Set() };
  state.nextBeat = () => new Promise((r) => state.waiters.push(r));
  // answered settles once every fetch made so far has its answer's head.
  state.answered = () => Promise.allSettled([...state.pending]);
  state.fetch = async (input, init = {}) => {
    const u = new URL(input instanceof Request ? input.url : String(input));
    if (keepToken && token && u.origin === url.origin && !u.searchParams.has('cube_token')) {
      u.searchParams.set('cube_token', token);
    }
    const method = init.method || 'GET';
    const ex = { method, path: u.pathname, toSession: u.searchParams.has('sessionid'), token: u.searchParams.has('cube_token') };
    exchanges.push(ex);
    const answer = fetch(u, init);
    state.pending.add(answer);
    let res;
    try {
      res = await answer;
    } finally {
      state.pending.delete(answer);
    }
    ex.status = res.status;
    ex.contentType = res.headers.get('content-type');
    emit({ ev: 'http', ...ex });
    if (method !== 'GET' || !res.body) return res;
    const reader = res.body.getReader();
    const stream = new ReadableStream({
      async pull(c) {
        try {
          const { value, done } = await reader.read();
          if (done) {
            c.close();
            return;
          }
          const n = Buffer.from(value).toString('latin1').split(': keep-alive').length - 1;
          if (n > 0) {
            state.heartbeats += n;
            for (const r of state.waiters) r();
            state.waiters = [];
          }
          c.enqueue(value);
        } catch (e) {
          c.error(e);
        }
      },
      cancel(reason) { return reader.cancel(reason); },
    });
    return new Response(stream, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
  return state;
}

function newClient(errors) {
  const client = new Client({ name: 'ts-legacy-agent', version: '1.0.0' }, {
    capabilities: { roots: { listChanged: true } },
  });
  client.onerror = (e) => { errors.push(String(e.message || e)); };
  client.setRequestHandler(ListRootsRequestSchema, async () => ({ roots: [] }));
  return client;
}

const text = (res) => res.content.map((c) => c.text).join('');

async function main() {
  if (token) {
    // As given: the POST goes to the announced endpoint, without the token.
    const exchanges = [];
    const tr = traced(exchanges, false);
    const errors = [];
    const client = newClient(errors);
    let error = '';
    try {
      await withTimeout(client.connect(new SSEClientTransport(url, { fetch: tr.fetch, requestInit: { headers } })), 20000, 'the plain connect');
    } catch (e) {
      error = String(e.message || e);
    }
    await client.close();
    const post = exchanges.find((e) => e.method === 'POST');
    emit({ ev: 'plain', error, status: post?.status ?? 0, token: post?.token ?? false });
  }

  const exchanges = [];
  const tr = traced(exchanges, true);
  const errors = [];
  const client = newClient(errors);
  const transport = new SSEClientTransport(url, { fetch: tr.fetch, requestInit: { headers } });
  await client.connect(transport);
  emit({ ev: 'connected', endpoint: transport._endpoint?.pathname + transport._endpoint?.search.replace(/cube_token=[^&]*/, 'cube_token=T').replace(/sessionid=[^&]*/, 'sessionid=S'), server: client.getServerVersion() });
  const waitBeats = env.TSMCP_HEARTBEATS === '1';
  if (waitBeats) await withTimeout(tr.nextBeat(), 20000, 'a heartbeat on the GET stream');

  const tools = await client.listTools();
  emit({ ev: 'tools', names: tools.tools.map((t) => t.name).sort() });

  // Progress the client acknowledges: the tool waits for the client's
  // roots/list_changed, sent once the first progress event arrived (with
  // TSMCP_HEARTBEATS, after a heartbeat more on the GET stream).
  {
    const seen = [];
    let roots = Promise.resolve();
    const res = await client.callTool({ name: 'ack' }, undefined, {
      onprogress: (p) => {
        seen.push(p.message);
        if (p.progress !== 1) return;
        roots = (waitBeats ? withTimeout(tr.nextBeat(), 20000, 'a heartbeat between progress events') : Promise.resolve())
          .then(() => client.sendRootsListChanged())
          .catch((e) => errors.push(`roots: ${e.message}`));
      },
    });
    // The result comes on the GET stream, maybe before the answer (202)
    // to the notification's POST that let the tool finish.
    await roots;
    emit({ ev: 'ack', progress: seen, result: text(res) });
  }

  // A request's result comes on the GET stream, and may come before the
  // 202 to the request's own POST: two connections, whose order neither
  // the proxy nor the gateway keeps (the go-sdk writes the 202 once the
  // message is queued, as the tool starts). The client's close aborts a
  // POST still waiting for its answer, whose status would then be
  // missing from the pattern (1 run in 75 under -race beside two CPU hogs
  // on a 2-core machine): wait for every answer first.
  await withTimeout(tr.answered(), 20000, "the answers to the client's POSTs");
  await client.close();
  emit({ ev: 'pattern', heartbeats: tr.heartbeats, errors,
    posts: exchanges.filter((e) => e.method === 'POST').map((e) => ({ status: e.status, toSession: e.toSession, token: e.token })) });
  emit({ ev: 'done' });
}

main().catch((e) => {
  emit({ ev: 'fatal', error: String(e.stack || e) });
  process.exit(1);
});
