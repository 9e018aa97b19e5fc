// TLS-only scenarios of bench/interop/run.sh, registered by clients.mjs when
// TLS=1: what a client sees of the handshake itself (ALPN, SNI, session
// resumption) and of a connection it cuts mid-stream, with or without a TLS
// close_notify. Raw node:tls sockets, so the handshake's options are the
// client's own; the request is written by hand.
import tls from 'node:tls';
import { once } from 'node:events';

export function register(S, { mode, host, port, tok, key, stats, until, run }) {
  const tokHead = (t) => Object.entries(t).map(([n, v]) => `${n}: ${v}\r\n`).join('');

  // One request on a new TLS connection to 127.0.0.1:port. servername
  // undefined sends no SNI (node sends none for an IP); the certificate is
  // then checked against 127.0.0.1, which the lab's certificate names too.
  function tlsReq({ servername, alpn, session, maxVersion, path = '/echo', hostHdr = `${host}:${port}`, token = tok }) {
    return new Promise((resolve) => {
      const opts = { host: '127.0.0.1', port: Number(port), ALPNProtocols: alpn, session, maxVersion };
      if (servername !== undefined) opts.servername = servername;
      let sess = null, facts = {}; const parts = [];
      const s = tls.connect(opts, () => (facts = { alpn: s.alpnProtocol, reused: s.isSessionReused(), proto: s.getProtocol() }, s.write(`GET ${path} HTTP/1.1\r\nHost: ${hostHdr}\r\n${tokHead(token)}Connection: close\r\n\r\n`)));
      s.on('session', (x) => { sess = x; });
      s.on('data', (d) => parts.push(d));
      s.on('error', (e) => resolve({ error: e.code || e.message }));
      s.on('close', () => {
        const raw = Buffer.concat(parts).toString('latin1');
        const [head, ...rest] = raw.split('\r\n\r\n');
        const body = rest.join('\r\n\r\n');
        let saw = null; try { saw = JSON.parse(body); } catch { saw = body.slice(0, 80); }
        resolve({ ...facts, status: head.split('\r\n')[0], saw, session: sess });
      });
    });
  }

  // ---- ALPN: a client offering h2 must get http/1.1 (or nothing) and an answer ----
  S('alpn.node-h2-http1', async () => {
    const r = await tlsReq({ servername: host, alpn: ['h2', 'http/1.1'] });
    return { cmp: { alpn: r.alpn, status: r.status, error: r.error ?? null, saw: r.saw && r.saw.url } };
  });
  S('alpn.node-h2-only', async () => {
    // No protocol in common: each side's answer to that is compared.
    const r = await tlsReq({ servername: host, alpn: ['h2'] });
    return { cmp: { alpn: r.alpn ?? null, status: r.status ?? null, error: r.error ?? null } };
  });
  S('alpn.curl-http2', async () => {
    const args = ['-sS', '-v', '--http2', '--cacert', process.env.LAB_CA, '--resolve', `${host}:${port}:127.0.0.1`, '-o', '/dev/null', '-w', '%{http_code} %{http_version}',
      ...(mode === 'proxy' ? ['-H', `cube-traffic-access-token: ${tok['cube-traffic-access-token']}`] : []), `https://${host}:${port}/echo`];
    let out, err;
    try { ({ stdout: out, stderr: err } = await run('curl', args)); } catch (e) { out = 'error'; err = String(e.stderr); }
    const alpn = err.split('\n').filter(l => /ALPN/.test(l)).map(l => l.replace(/^\*\s*/, '').trim());
    return { cmp: { out, alpn } };
  });

  // ---- SNI ----
  S('sni.none', async () => {
    // A client dialing the node IP: no SNI, the sandbox named by Host alone.
    const r = await tlsReq({});
    return { cmp: { status: r.status, error: r.error ?? null, saw: r.saw && r.saw.headers && r.saw.headers.filter(h => h.startsWith('host')) } };
  });
  S('sni.none-curl', async () => {
    const args = ['-sS', '--cacert', process.env.LAB_CA, '-H', `Host: ${host}:${port}`, '-w', ' %{http_code}',
      ...(mode === 'proxy' ? ['-H', `cube-traffic-access-token: ${tok['cube-traffic-access-token']}`] : []), `https://127.0.0.1:${port}/fixed?size=100`];
    let out; try { out = (await run('curl', args)).stdout.slice(-4); } catch (e) { out = String(e.stderr).slice(0, 80); }
    return { cmp: { out } };
  });
  S('sni.other-host', async () => {
    // SNI names sandbox lab, Host sandbox other (same node server behind
    // it), with other's token: the answer is other's. With lab's token the
    // proxy must refuse (403): a TLS session authorizes nothing.
    const other = `${host.replace('-lab.', '-other.')}:${port}`;
    const otherTok = mode === 'proxy' ? { 'cube-traffic-access-token': process.env.TRAFFIC_TOKEN_OTHER } : {};
    const r = await tlsReq({ servername: host, hostHdr: other, token: otherTok });
    const out = { cmp: { status: r.status, error: r.error ?? null, saw: r.saw && r.saw.headers && r.saw.headers.filter(h => h.startsWith('host')) } };
    if (mode === 'proxy') {
      const x = await tlsReq({ servername: host, hostHdr: other, token: tok });
      out.check = { 'lab token for Host other is refused': /^HTTP\/1\.1 403/.test(x.status) };
      out.info = { crossToken: x.status };
    }
    return out;
  });

  // ---- session resumption ----
  for (const [n, maxVersion] of [['tls13', 'TLSv1.3'], ['tls12', 'TLSv1.2']]) {
    S('resume.' + n, async () => {
      const a = await tlsReq({ servername: host, maxVersion });
      const b = await tlsReq({ servername: host, maxVersion, session: a.session });
      return { cmp: { proto: [a.proto, b.proto], gotSession: !!a.session, reused: [a.reused, b.reused], status: [a.status, b.status] } };
    });
  }

  // ---- a client that leaves mid-stream: the sandbox must learn it ----
  // destroy() closes the socket without a close_notify (a crashed or killed
  // client, most browsers' tab close); end() sends close_notify, then FIN.
  async function cut(how, path, marker, closedRec) {
    const k = key('cut');
    const s = tls.connect({ host: '127.0.0.1', port: Number(port), servername: host });
    await once(s, 'secureConnect');
    s.write(`GET ${path}&key=${k} HTTP/1.1\r\nHost: ${host}:${port}\r\n${tokHead(tok)}\r\n`);
    let got = '';
    await new Promise((resolve) => { s.on('data', (d) => { got += d.toString('latin1'); if (got.includes(marker)) resolve(); }); s.on('close', resolve); });
    s.on('error', () => {});
    const t0 = Date.now();
    if (how === 'close-notify') s.end(); else s.destroy();
    // 6 s, late or not: the sandbox writes nothing after the marker
    // (backend.mjs, /abort; an SSE stream held open), so only a close noticed
    // on the client's socket (or on the proxy's own heartbeat) is seen at all.
    const st = await until(async () => (await stats(k)).find(closedRec), 6000);
    return { cmp: { status: got.split('\r\n')[0], sawMarker: got.includes(marker), sandboxSawClose: !!st }, info: { ms: Date.now() - t0 } };
  }
  const byAbort = (x) => x.closedAfterMs !== undefined;
  const bySSE = (x) => x.closed;
  S('cut.no-close-notify', () => cut('destroy', '/abort?x=1', 'first', byAbort));
  S('cut.no-close-notify-sized', () => cut('destroy', '/abort?fixed=1', 'first', byAbort));
  S('cut.close-notify', () => cut('close-notify', '/abort?x=1', 'first', byAbort));
  S('cut.sse-no-close-notify', () => cut('destroy', '/sse?v=basic', 'data: last', bySSE));
  S('cut.sse-close-notify', () => cut('close-notify', '/sse?v=basic', 'data: last', bySSE));
}
