// A deliberately faulty proxy for checking the interop lab itself
// (bench/interop/run.sh with INTEROP_SUBJECT=buffering or deaf): it stands in
// front of CubeProxy where the proxy-mode clients connect and does what the
// lab's timing checks exist to catch, so each of them must come out DIFFERS.
// In both modes it never passes on a client that leaves (an abort, a cut):
// the request to CubeProxy runs on until it ends by itself.
//
//   FAULT=buffering: every answer is buffered whole and sent only when it has
//     ended (nginx's proxy_buffering), so no streamed chunk or event is
//     prompt; and the `retry:` field of an event stream is dropped, so an
//     EventSource reconnects after its default delay.
//   FAULT=deaf: answers pass on as they come; only a client leaving does not,
//     so a download the client gives up mid-way stays open at the sandbox.
//
//   FAULT=deaf UPSTREAM_PORT=18280 PORT=18290 TLS_PORT=18293 TLS_CERT=leaf.pem TLS_KEY=leaf-key.pem node faulty.mjs
//
// WebSocket upgrades are not handled: run it with the scenarios it is for.
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';

const upstreamPort = Number(process.env.UPSTREAM_PORT || 18280);
const fault = process.env.FAULT;
if (fault !== 'buffering' && fault !== 'deaf') throw new Error(`FAULT: buffering or deaf, not ${fault}`);
const hop = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length']);

function handle(req, res) {
  const up = http.request({ host: '127.0.0.1', port: upstreamPort, method: req.method, path: req.url, headers: req.headers }, (ur) => {
    if (fault === 'deaf') {
      const headers = {};
      for (const [n, v] of Object.entries(ur.headers)) if (n !== 'connection' && n !== 'keep-alive' && n !== 'transfer-encoding') headers[n] = v;
      res.writeHead(ur.statusCode, headers);
      // pipe() stops at a client gone but leaves the upstream answer open.
      ur.pipe(res);
      return;
    }
    const parts = [];
    ur.on('data', (c) => parts.push(c));
    ur.on('end', () => {
      if (res.destroyed) return;
      let body = Buffer.concat(parts);
      const sse = /text\/event-stream/.test(ur.headers['content-type'] || '') && !ur.headers['content-encoding'];
      if (sse) body = Buffer.from(body.toString('utf8').replace(/^retry:[^\r\n]*(\r\n|\r|\n)/gm, ''));
      const headers = {};
      for (const [n, v] of Object.entries(ur.headers)) if (!hop.has(n)) headers[n] = v;
      // Sized as the sandbox sized it; else chunked (node's default), as
      // the sandbox's answer was, so that only the timing differs.
      if (ur.headers['content-length'] !== undefined && !sse) headers['content-length'] = body.length;
      res.writeHead(ur.statusCode, headers);
      res.end(req.method === 'HEAD' ? undefined : body);
    });
    ur.on('error', () => res.destroy());
  });
  up.on('error', () => { if (!res.headersSent) { res.writeHead(502); res.end('faulty: upstream error'); } else res.destroy(); });
  // The body is streamed on, but a client that goes away is not passed on:
  // pipe() leaves the upstream request open when req ends early.
  req.pipe(up);
}

http.createServer(handle).listen(Number(process.env.PORT || 18290), '127.0.0.1', () => console.log('faulty http'));
if (process.env.TLS_PORT) {
  const opts = { cert: fs.readFileSync(process.env.TLS_CERT), key: fs.readFileSync(process.env.TLS_KEY), ALPNProtocols: ['http/1.1'] };
  https.createServer(opts, handle).listen(Number(process.env.TLS_PORT), '127.0.0.1', () => console.log('faulty https'));
}
