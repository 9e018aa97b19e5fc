// Compares what each client saw directly and through CubeProxy, from the JSON
// lines of clients.mjs and clients.py: one line per scenario, `same` or the
// difference. A difference listed in `expected` is the proxy's documented
// behaviour (README "Forwarding behaviour") and is printed as such; any other
// difference makes the exit status 1.
//
//   node compare.mjs results.jsonl
import fs from 'node:fs';

// scenario -> [path prefix of the difference, why it is correct]
const expected = {
  'curl.h2c-post': [['cmp.', 'a POST with Upgrade: h2c reaches the sandbox as a plain request, Upgrade removed (README: WebSocket)']],
  'curl.h2c-get': [['cmp.', 'as curl.h2c-post: node 20.20 answers an h2c upgrade offer with its own 400 (earlier node 20 ignored it, so this scenario was the same); the proxy removes the offer (README: WebSocket)']],
  'curl.trailers': [['cmp.headers', 'the trailer fields of a chunked response are not relayed, as nginx (README: Decisions)']],
  'fetch.trailers': [['cmp.headers.trailer', 'nor is the Trailer field that names them (README: Decisions)']],
  'curl.sse': [['cmp.body', 'a silent event stream gets `: keep-alive` comments (heartbeat_interval, 1 s here)']],
  'eventsource.cr': [['cmp.events.7', 'the proxy\'s heartbeat after a stream held open on a lone CR (`data: last\\r\\r`) tells the client that CR ended a line, so it dispatches the last event; directly the parser waits for the byte after that CR (it could be CRLF) and never sees the event']],
  'curl.early-hints': [['cmp.headers', 'interim 1xx answers (103 Early Hints) are not relayed, as nginx (README: Decisions)']],
  'curl.expect-100': [['cmp.', 'Expect: 100-continue is answered by the proxy and not passed on, as nginx (README: Decisions); the echo of the request is shorter by it']],
  'py.expect-100': [['cmp.saw.headers', 'as curl.expect-100']],
  'curl.expect-reject': [['cmp.', 'the proxy answers 100 before the sandbox sees the head, so a sandbox that refuses only in its 100-continue check gets the body (README: Decisions)']],
  'py.expect-reject': [['cmp.', 'as curl.expect-reject']],
  'py.trickle-length': [['cmp.firstPieceReachedSandbox', 'fasthttp reads the first 8 KiB of a Content-Length body (all of a smaller one) before the proxy sees the request (README: Decisions); a chunked body streams at once (py.trickle-chunked)']],
  'tls/py.cut-close-notify-only': [['cmp.sandboxSawClose', 'a close_notify with the TCP connection left open is a TLS 1.3 half-close (RFC 8446 6.1: the client may still read); the proxy, like nginx, watches the socket (FIN, reset) and reads no TLS record of a client whose answer it is streaming, so the stream ends when the client closes TCP or the sandbox ends it; node closes at the alert']],
  'fetch.cookies': [['cmp.headers.set-cookie.2', 'a Set-Cookie loses its Domain, its own host\'s too, so the cookie is host-only: that Domain would take in every name under the host, where other sandboxes\' pages may be served by their path (README: Proxy auth, Cookies a sandbox sets)']],
  'eventsource.sandbox-down': [['cmp.errors', 'a sandbox that refuses connections is a 502 through the proxy, on which EventSource stops, where a refused connection directly makes it retry (any reverse proxy answers so)']],
};

const byName = new Map();
for (const line of fs.readFileSync(process.argv[2], 'utf8').split('\n')) {
  if (!line.trim()) continue;
  const r = JSON.parse(line);
  if (!byName.has(r.scenario)) byName.set(r.scenario, {});
  byName.get(r.scenario)[r.mode] = r;
}
// Paths where a and b differ, with both values (shortened).
function diff(a, b, path, out) {
  if (JSON.stringify(a) === JSON.stringify(b)) return out;
  if (a && b && typeof a === 'object' && typeof b === 'object' && Array.isArray(a) === Array.isArray(b) && !(Array.isArray(a) && a.length !== b.length && typeof a[0] !== 'object')) {
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) diff(a[k], b[k], `${path}.${k}`, out);
    return out;
  }
  const s = (v) => v === undefined ? '(none)' : JSON.stringify(v).slice(0, 140);
  out.push(`${path}: direct=${s(a)} proxy=${s(b)}`);
  return out;
}
let bad = 0;
const w = Math.max(...[...byName.keys()].map(n => n.length));
for (const [name, { direct, proxy }] of byName) {
  if (!direct || !proxy) { console.log(`${name.padEnd(w)}  MISSING ${direct ? 'proxy' : 'direct'} run`); bad++; continue; }
  const d = diff(direct.cmp, proxy.cmp, 'cmp', []);
  const info = diff(direct.info || {}, proxy.info || {}, 'info', []);
  // A proxy-only check (what a direct connection cannot show, such as a
  // token refused for another sandbox's Host) must hold.
  for (const [what, ok] of Object.entries(proxy.check || {})) if (!ok) d.push(`check failed: ${what}`);
  if (!d.length) { console.log(`${name.padEnd(w)}  same`); continue; }
  // Over TLS (tls/<name>) a scenario keeps the expected differences of its plain run.
  const exp = expected[name] || expected[name.replace(/^tls\//, '')] || [];
  const unexplained = d.filter(x => !exp.some(([p]) => x.startsWith(p)));
  if (!unexplained.length) {
    console.log(`${name.padEnd(w)}  same but expected differences: ${exp.map(e => e[1]).join('; ')}`);
    for (const x of d) console.log(`${''.padEnd(w)}    ${x}`);
    continue;
  }
  bad++;
  console.log(`${name.padEnd(w)}  DIFFERS`);
  for (const x of d) console.log(`${''.padEnd(w)}    ${x}`);
  for (const x of info.slice(0, 6)) console.log(`${''.padEnd(w)}    (${x})`);
}
console.log(bad ? `\n${bad} scenario(s) differ` : '\nevery scenario the same');
process.exit(bad ? 1 : 0);
