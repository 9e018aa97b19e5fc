// The sandbox of bench/interop/run.sh: one node server (HTTP + `ws`) whose
// endpoints each exercise one behaviour a client may observe. What a request
// looked like on arrival (headers, body digest, framing) is echoed back or
// kept under a key that the client reads from /stats afterwards, so a client
// can compare what the sandbox saw directly and through the proxy.
//
//   PORT=20100 node backend.mjs
//   PORT=20100 TLS_PORT=20102 TLS_CERT=leaf.pem TLS_KEY=leaf-key.pem node backend.mjs
//
// With TLS_PORT the same endpoints (WebSocket included, one stats table) are
// served over HTTPS too, ALPN http/1.1 only like CubeProxy's listener, so a
// client over TLS has a direct side to compare the proxy's HTTPS with.
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import zlib from 'node:zlib';
import crypto from 'node:crypto';
import { WebSocketServer } from 'ws';

const port = Number(process.env.PORT || 20100);
const stats = new Map(); // key -> [records]
const note = (k, v) => { if (!k) return; if (!stats.has(k)) stats.set(k, []); stats.get(k).push(v); };
const sleep = (ms) => new Promise(r => setTimeout(r, ms));
// Acknowledgements: a streaming endpoint given a key writes a piece, then
// waits for the client's GET /ack?key=K&n=N (sent directly or through the
// proxy, as the stream) before it writes more or ends. /ack answers
// {"held":true} when the sandbox was still waiting for it, so the piece
// reached the client while the stream was held open: proof of streaming that
// no machine load can fake or break, where a time bound could (a 150 ms bound
// on chunk lags failed 3 runs in 13 at load 10–14). A proxy that buffers gets
// the piece to the client only after ACK_WAIT_MS, when the sandbox gives up
// waiting and ends the stream: {"held":false}, a clear "not prompt" and no hang.
const ACK_WAIT_MS = 10000;
const ackWaiters = new Map(); // `${key}/${n}` -> resolve
function waitAck(key, n, res) {
  return new Promise((resolve) => {
    const id = `${key}/${n}`;
    const done = (v) => { clearTimeout(t); ackWaiters.delete(id); res.off('close', gone); resolve(v); };
    const gone = () => done(false);
    const t = setTimeout(() => done(false), ACK_WAIT_MS);
    ackWaiters.set(id, done);
    res.on('close', gone);
  });
}
const sha = (b) => crypto.createHash('sha256').update(b).digest('hex').slice(0, 16);
// Deterministic bytes: the same body every time for a size, cut from the
// longest made so far (making 24 MiB held this one event loop, that every
// client shares, for 0.3 s a time). The bytes are only read, never written.
let pool = Buffer.alloc(0);
const bytes = (n) => {
  if (n > pool.length) { const b = Buffer.alloc(n); for (let i = 0; i < n; i++) b[i] = (i * 7 + (i >> 8)) & 0xff; pool = b; }
  return pool.subarray(0, n);
};

// Headers the proxy adds or removes by design are split off, so `headers`
// holds what the client sent end to end and `fwd` what the proxy added.
const proxyOwn = new Set(['x-forwarded-for', 'x-forwarded-proto', 'x-forwarded-host', 'x-real-ip', 'x-cube-request-id', 'traceparent']);
// Hop-by-hop headers (the client's own connection options) are split off too,
// and both go to the x-lab-extra response header rather than the body, so that
// the body (and its length) is the same both ways when the proxy is right.
const hop = new Set(['connection', 'keep-alive', 'te', 'upgrade', 'proxy-connection', 'transfer-encoding']);
function seen(req) {
  const headers = [], fwd = {}, hops = [];
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const n = req.rawHeaders[i].toLowerCase(), v = req.rawHeaders[i + 1];
    if (proxyOwn.has(n)) fwd[n] = n === 'x-cube-request-id' ? 'set' : v;
    else if (hop.has(n)) hops.push(`${n}: ${v}`);
    else if (n === 'host') headers.push(`${n}: ${v.replace(/:\d+$/, '')}`);
    else headers.push(`${n}: ${v}`);
  }
  headers.sort();
  return { s: { method: req.method, url: req.url, headers }, extra: encodeURIComponent(JSON.stringify({ httpVersion: req.httpVersion, hop: hops, fwd })) };
}
async function readBody(req) {
  const parts = []; const sizes = [];
  for await (const c of req) { parts.push(c); sizes.push(c.length); }
  const b = Buffer.concat(parts);
  return { len: b.length, sha: sha(b), framing: req.headers['transfer-encoding'] ? 'chunked' : (req.headers['content-length'] !== undefined ? 'length' : 'none') };
}

const sseVariants = {
  // Every field kind of the event-stream format (WHATWG HTML §9.2.6).
  basic: ['retry: 250\n', ': a comment\n', 'id: 1\nevent: greet\ndata: hello\n\n', 'data: line1\ndata: line2\n\n',
    'id: 2\ndata:no-space\ndata:  two-spaces\n\n', 'event: empty\ndata\n\n', 'data: {"json":true}\n\n',
    'id\ndata: id reset\n\n', 'data: ünïcødé ✓\n\n', 'dat: unknown field\n\n', 'data: last\n\n'],
};
sseVariants.crlf = sseVariants.basic.map(s => s.replace(/\n/g, '\r\n'));
sseVariants.cr = sseVariants.basic.map(s => s.replace(/\n/g, '\r'));
sseVariants.bom = ['\uFEFF' + sseVariants.basic[0], ...sseVariants.basic.slice(1)];
// One event cut in the middle of its line, of a multi-byte character and of
// its CRLF, across writes some time apart.
sseVariants.split = [Buffer.from('id: 1\ndata: hal'), Buffer.from('f and h'), Buffer.from([0xc3]), Buffer.from([0xa4, 0x6c, 0x66, 0x0d]), Buffer.from('\n\r\n'), Buffer.from('data: last\n\n')];

async function sse(req, res, u) {
  const v = u.searchParams.get('v') || 'basic';
  const key = u.searchParams.get('key');
  const last = req.headers['last-event-id'];
  note(key, { t: Date.now(), lastEventId: last ?? null, accept: req.headers.accept ?? null, cacheControl: req.headers['cache-control'] ?? null });
  if (v === 'reconnect') {
    // Three events per connection, then the server ends the stream; from id 6
    // on it answers 204, which tells an EventSource to stop reconnecting.
    const from = last ? Number(last) : 0;
    if (from >= 6) { res.writeHead(204); res.end(); return; }
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    res.write('retry: 300\n\n');
    for (let i = from + 1; i <= from + 3; i++) { res.write(`id: ${i}\ndata: ev${i}\n\n`); await sleep(20); }
    res.end();
    return;
  }
  if (v === 'plain') { // not an event stream: EventSource must fail, not retry
    res.writeHead(200, { 'content-type': 'text/plain' }); res.end('data: no\n\n'); return;
  }
  if (v === 'gzip') { // a gateway behind a compression middleware: each event flushed through gzip
    res.writeHead(200, { 'content-type': 'text/event-stream', 'content-encoding': 'gzip' });
    const z = zlib.createGzip(); z.pipe(res);
    z.write('id: 1\ndata: zipped\n\n'); z.flush(zlib.constants.Z_SYNC_FLUSH);
    if (key) { await waitAck(key, 0, res); if (!res.destroyed) z.end('data: late\n\n'); return; }
    const t = setTimeout(() => { z.end('data: late\n\n'); }, 3000);
    res.on('close', () => clearTimeout(t));
    return;
  }
  if (v === 'held') {
    // One event, then silence while the stream stays open: the client must
    // see it at once, not when the stream ends.
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('id: 1\ndata: first\n\n');
    // With a key, held until the client acknowledges the event (or gives up).
    if (key) { await waitAck(key, 0, res); if (!res.destroyed) { res.write('data: late\n\n'); res.end(); } return; }
    const t = setTimeout(() => { res.write('data: late\n\n'); res.end(); }, 3000);
    res.on('close', () => clearTimeout(t));
    return;
  }
  if (v === 'silent') {
    // Nothing for longer than the proxy's heartbeat interval, then an event
    // behind a BOM: heartbeat comments must not cost the client the event.
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.flushHeaders();
    await sleep(2500);
    if (!res.destroyed) res.end('\uFEFFid: 9\ndata: after silence\n\n');
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  // Held open: the client closes once it has the last event (watched from
  // the start, so that a client quicker than the last sleep is seen too).
  res.on('close', () => note(key, { closed: true }));
  for (const piece of sseVariants[v]) { if (res.destroyed) return; res.write(piece); await sleep(15); }
}

async function handle(req, res) {
  const u = new URL(req.url, 'http://x');
  const key = u.searchParams.get('key');
  try {
    switch (u.pathname) {
      case '/echo': case '/upload': {
        const { s, extra } = seen(req); s.body = await readBody(req);
        note(key, s);
        const out = Buffer.from(JSON.stringify(s));
        res.writeHead(200, { 'content-type': 'application/json', 'x-app': 'a', 'x-multi': ['1', '2'], 'content-length': out.length, 'x-lab-extra': extra });
        res.end(out); return;
      }
      case '/refuse': { // answers from the head alone, without reading the body
        res.writeHead(413, { 'content-type': 'text/plain' });
        res.end('refused on the head'); return;
      }
      case '/trickle': { // notes each piece of the body as it arrives, and an abort
        let n = 0;
        req.on('aborted', () => note(key, { aborted: true }));
        try { for await (const c of req) { n += c.length; note(key, { n }); } } catch { note(key, { aborted: true }); return; }
        res.end(`got ${n}`); return;
      }
      case '/slowhead': { // no answer for 10 s: a client giving up first must be seen
        // (a close is noted only before the answer, so a proxy that waits
        // for the answer before it lets go is never seen to close)
        const t0 = Date.now();
        const t = setTimeout(() => res.end('late'), 10000);
        res.on('close', () => { clearTimeout(t); if (!res.writableEnded) note(key, { closedAfterMs: Date.now() - t0 }); });
        return;
      }
      case '/fixed': {
        const all = bytes(Number(u.searchParams.get('size') || 1000));
        const range = /^bytes=(\d+)-(\d+)$/.exec(req.headers.range || '');
        const b = range ? all.subarray(Number(range[1]), Number(range[2]) + 1) : all;
        res.writeHead(range ? 206 : 200, { 'content-type': 'application/octet-stream', 'content-length': b.length, etag: '"e1"', 'accept-ranges': 'bytes',
          ...(range ? { 'content-range': `bytes ${range[1]}-${range[2]}/${all.length}` } : {}) });
        res.end(req.method === 'HEAD' ? undefined : b); return;
      }
      case '/chunked': {
        // ack=K: chunk i+1 (and the end) only once chunk i is acknowledged;
        // once a wait times out the rest is written at once.
        const n = Number(u.searchParams.get('n') || 5), ms = Number(u.searchParams.get('ms') || 50), ack = u.searchParams.get('ack');
        res.writeHead(200, { 'content-type': 'text/plain', 'x-app': 'chunked' });
        let held = !!ack;
        for (let i = 0; i < n; i++) {
          if (res.destroyed) return;
          res.write(`chunk ${i} ${Date.now()}\n`);
          if (held) held = await waitAck(ack, i, res); else if (!ack) await sleep(ms);
        }
        res.end(); return;
      }
      case '/ack': {
        const done = ackWaiters.get(`${key}/${u.searchParams.get('n') || 0}`);
        if (done) done(true);
        res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' }); res.end(JSON.stringify({ held: !!done })); return;
      }
      case '/trailers': {
        res.writeHead(200, { 'content-type': 'text/plain', trailer: 'x-checksum' });
        res.write('body with trailer\n');
        res.addTrailers({ 'x-checksum': 'abc' });
        res.end(); return;
      }
      case '/gzip': {
        const body = Buffer.from('compress me '.repeat(500));
        if (/gzip/.test(req.headers['accept-encoding'] || '')) {
          const z = zlib.gzipSync(body);
          res.writeHead(200, { 'content-type': 'text/plain', 'content-encoding': 'gzip', vary: 'Accept-Encoding', 'content-length': z.length });
          res.end(z);
        } else { res.writeHead(200, { 'content-type': 'text/plain', vary: 'Accept-Encoding' }); res.end(body); }
        return;
      }
      case '/redirect': {
        const to = u.searchParams.get('abs') ? `http://${req.headers.host}/echo?from=abs` : '/echo?from=rel';
        res.writeHead(Number(u.searchParams.get('code') || 302), { location: to }); res.end('moved'); return;
      }
      case '/cookies': {
        res.setHeader('set-cookie', ['a=1; Path=/; HttpOnly', 'b=2; Path=/; SameSite=Lax', `c=3; Domain=${(req.headers.host || '').replace(/:\d+$/, '')}; Path=/`]);
        res.end('cookies'); return;
      }
      case '/status': {
        const code = Number(u.searchParams.get('code'));
        res.writeHead(code, code === 304 ? { etag: '"e1"' } : { 'x-app': 'status' });
        res.end(); return;
      }
      case '/early': { // 103 Early Hints, then the answer
        res.writeEarlyHints({ link: '</style.css>; rel=preload; as=style' });
        await sleep(20);
        res.end('after hints'); return;
      }
      case '/close': { // Connection: close, no length: the body ends with the connection
        res.writeHead(200, { connection: 'close', 'content-type': 'text/plain' });
        res.write('until close ');
        await sleep(30);
        res.end('end'); return;
      }
      case '/abort': { // the client leaves mid-stream: does the sandbox see it?
        // fixed=1: a sized body (a file generated as it is sent), else chunked
        res.writeHead(200, { 'content-type': 'text/plain', ...(u.searchParams.get('fixed') ? { 'content-length': 1 << 20 } : {}) });
        res.write('first\n');
        if (u.searchParams.get('fixed')) res.write('x'.repeat(100000));
        // Then silence: a proxy that learns of a gone client only when it
        // next writes to it never closes this stream, so a close seen at
        // all (the client polls for it for some seconds) was noticed on the
        // client's socket, however loaded the machine. (A '.' every 2 s
        // here made that a race against a 1.5 s bound.)
        const t0 = Date.now();
        res.on('close', () => { note(key, { closedAfterMs: Date.now() - t0 }); });
        return;
      }
      case '/sse': return await sse(req, res, u);
      case '/stats': {
        const out = JSON.stringify(stats.get(key) || []);
        res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' }); res.end(out); return;
      }
      default:
        res.writeHead(404, { 'content-type': 'text/plain' }); res.end('no such endpoint: ' + req.url);
    }
  } catch (e) {
    if (!res.headersSent) { res.writeHead(500); res.end(String(e)); } else res.destroy();
  }
}

// Expect: 100-continue. /upload?reject=1 answers 413 without reading the body
// (what a size-checking sandbox does); the rest get 100 Continue.
function checkContinue(req, res) {
  const u = new URL(req.url, 'http://x');
  note(u.searchParams.get('key'), { expect: req.headers.expect, t: Date.now() });
  if (u.searchParams.get('reject')) {
    res.writeHead(413, { 'content-type': 'text/plain', connection: 'close' });
    res.end('too large');
    return;
  }
  res.writeContinue();
  handle(req, res);
}

const wsOptions = {
  path: '/ws', perMessageDeflate: { threshold: 0 }, maxPayload: 64 << 20,
  handleProtocols: (protocols) => protocols.has('b') ? 'b' : false,
  verifyClient: (info, cb) => {
    const u = new URL(info.req.url, 'http://x');
    if (u.searchParams.get('v') === 'reject') cb(false, 403, 'no entry', { 'x-app': 'refused' }); else cb(true);
  },
};
function onWebSocket(ws, req) {
  const u = new URL(req.url, 'http://x');
  const v = u.searchParams.get('v') || 'echo', key = u.searchParams.get('key');
  const rec = { extensions: req.headers['sec-websocket-extensions'] ?? null, negotiated: Object.keys(ws._extensions || {}), protocol: ws.protocol, headers: seen(req).s.headers.filter((h) => !h.startsWith('sec-websocket-key')) };
  note(key, rec);
  ws.on('ping', (d) => note(key, { ping: d.toString() }));
  ws.on('pong', (d) => note(key, { pong: d.toString() }));
  ws.on('close', (code, reason) => note(key, { close: code, reason: reason.toString() }));
  ws.on('message', (data, isBinary) => {
    if (v === 'echo') ws.send(data, { binary: isBinary });
    else note(key, { msg: isBinary ? 'bin:' + sha(data) : String(data).slice(0, 40), len: data.length });
  });
  if (v === 'frag') { // one message in three frames, then one in one
    ws.send('part1-', { fin: false }); ws.send('part2-', { fin: false }); ws.send('part3', { fin: true });
    ws.send('whole');
  }
  if (v === 'ping') ws.ping('srv');
  if (v === 'close') { ws.send('bye soon'); ws.close(4002, 'server-bye ✓'); }
  if (v === 'terminate') { ws.send('cut'); setTimeout(() => ws.terminate(), 50); }
}

function serve(server, p, what) {
  server.on('checkContinue', checkContinue);
  new WebSocketServer({ server, ...wsOptions }).on('connection', onWebSocket);
  server.listen(p, '127.0.0.1', () => console.log(`backend ${what} on ${p}`));
}
serve(http.createServer(handle), port, 'http');
if (process.env.TLS_PORT) {
  const tlsOpts = { cert: fs.readFileSync(process.env.TLS_CERT), key: fs.readFileSync(process.env.TLS_KEY), ALPNProtocols: ['http/1.1'] };
  serve(https.createServer(tlsOpts, handle), Number(process.env.TLS_PORT), 'https');
}
