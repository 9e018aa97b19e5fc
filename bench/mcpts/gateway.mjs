// MCP gateway on the TypeScript SDK, for bench/mcpts/run.sh: streamable
// HTTP on /mcp (sessions, an event store so streams resume, SSE answers)
// and the older HTTP+SSE transport on /sse + /messages, behind a bearer
// token, as a sandbox's gateway on port 50005 would be.
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { SSEServerTransport } from '@modelcontextprotocol/sdk/server/sse.js';
import { InMemoryEventStore } from '@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js';
import { z } from 'zod';

const PORT = Number(process.env.PORT || 50005);
const TOKEN = process.env.GW_TOKEN || 'gw-secret';
const sleep = (ms, signal) => new Promise((res, rej) => {
  const t = setTimeout(res, ms);
  signal?.addEventListener('abort', () => { clearTimeout(t); rej(new Error('aborted')); });
});

function newServer() {
  const s = new McpServer({ name: 'ts-gw', version: '1' }, { capabilities: { logging: {} } });
  s.tool('echo', { text: z.string() }, async ({ text }) => ({ content: [{ type: 'text', text }] }));
  s.tool('headers', {}, async (_a, extra) => ({ content: [{ type: 'text', text: JSON.stringify(extra.requestInfo?.headers ?? {}) }] }));
  s.tool('count', { n: z.number(), stepMs: z.number() }, async ({ n, stepMs }, extra) => {
    const tok = extra._meta?.progressToken;
    for (let i = 1; i <= n; i++) {
      if (i > 1) await sleep(stepMs, extra.signal);
      if (tok !== undefined) await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: tok, progress: i, total: n, message: 'step ' + i } });
    }
    return { content: [{ type: 'text', text: 'counted ' + n }] };
  });
  s.tool('silent', { ms: z.number() }, async ({ ms }, extra) => { await sleep(ms, extra.signal); return { content: [{ type: 'text', text: 'slept ' + ms }] }; });
  // notify: a server notification with no related request goes to the standalone GET stream.
  s.tool('notify', { text: z.string() }, async ({ text }) => {
    await s.server.notification({ method: 'notifications/message', params: { level: 'info', data: text } });
    return { content: [{ type: 'text', text: 'sent' }] };
  });
  // poll: the server closes the call's POST stream mid-call (SSE polling); the client resumes with GET + Last-Event-ID.
  s.tool('poll', {}, async (_a, extra) => {
    const tok = extra._meta?.progressToken;
    const prog = (i) => extra.sendNotification({ method: 'notifications/progress', params: { progressToken: tok, progress: i, total: 4 } });
    await prog(1); await sleep(200); await prog(2);
    extra.closeSSEStream?.();
    await sleep(300); await prog(3); await sleep(300); await prog(4);
    return { content: [{ type: 'text', text: extra.closeSSEStream ? 'polled' : 'no-close' }] };
  });
  s.tool('big', { bytes: z.number() }, async ({ bytes }) => ({ content: [{ type: 'text', text: 'x'.repeat(bytes) }] }));
  s.tool('size', { text: z.string() }, async ({ text }) => ({ content: [{ type: 'text', text: String(text.length) }] }));
  // ask: a server-initiated request (elicitation) answered by the client while the call's stream is open.
  s.tool('ask', {}, async () => {
    const r = await s.server.elicitInput({ message: 'name?', requestedSchema: { type: 'object', properties: { name: { type: 'string' } } } });
    return { content: [{ type: 'text', text: 'hello ' + r.content?.name }] };
  });
  return s;
}

const sessions = new Map(); // streamable sessions
const legacy = new Map();   // legacy SSE sessions
const eventStore = new InMemoryEventStore();

const srv = http.createServer(async (req, res) => {
  const url = new URL(req.url, 'http://x');
  if (req.headers.authorization !== 'Bearer ' + TOKEN) {
    res.writeHead(401, { 'content-type': 'application/json', 'www-authenticate': 'Bearer realm="mcp"' });
    res.end('{"error":"invalid_token"}'); return;
  }
  try {
    if (url.pathname === '/mcp') {
      const sid = req.headers['mcp-session-id'];
      if (sid) {
        const t = sessions.get(sid);
        if (!t) { res.writeHead(404).end('{"error":"no session"}'); return; }
        await t.handleRequest(req, res); return;
      }
      if (req.method !== 'POST') { res.writeHead(400).end('{"error":"no session id"}'); return; }
      const t = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(), eventStore, retryInterval: 300,
        onsessioninitialized: (id) => sessions.set(id, t),
      });
      t.onclose = () => { if (t.sessionId) sessions.delete(t.sessionId); };
      await newServer().connect(t);
      await t.handleRequest(req, res); return;
    }
    if (url.pathname === '/sse' && req.method === 'GET') {
      const t = new SSEServerTransport('/messages', res);
      legacy.set(t.sessionId, t);
      res.on('close', () => legacy.delete(t.sessionId));
      await newServer().connect(t); return;
    }
    if (url.pathname === '/messages' && req.method === 'POST') {
      const t = legacy.get(url.searchParams.get('sessionId'));
      if (!t) { res.writeHead(404).end('no session'); return; }
      await t.handlePostMessage(req, res); return;
    }
    res.writeHead(404).end('not found');
  } catch (e) {
    console.error('server error', e);
    if (!res.headersSent) res.writeHead(500).end(String(e));
  }
});
srv.listen(PORT, '127.0.0.1', () => console.log('ts gateway on', PORT));
