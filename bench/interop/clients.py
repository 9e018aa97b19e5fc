"""Python 3 stdlib clients of bench/interop/run.sh (http.client, urllib and a
raw socket where the stdlib has no API: Expect: 100-continue), driving
backend.mjs directly or through CubeProxy. One JSON line per scenario, as
clients.mjs: `cmp` must be the same both ways, `info` may differ.

    python3 clients.py direct|proxy [scenario-prefix ...]
"""
import hashlib
import http.client
import json
import os
import socket
import ssl
import sys
import time
import urllib.parse
import urllib.request

mode = sys.argv[1]
only = sys.argv[2:]
bport = int(os.environ.get("BACKEND_PORT", "20100"))
# TLS=1: the same clients over HTTPS, to CubeProxy's https_addr or the
# sandbox's own TLS port, trusting the lab's CA; sandbox names resolve to
# 127.0.0.1 in this process, so SNI names the sandbox as a real client's does.
TLS = os.environ.get("TLS") == "1"
if TLS:
    port = int(os.environ["PROXY_TLS_PORT" if mode == "proxy" else "BACKEND_TLS_PORT"])
else:
    port = int(os.environ.get("PROXY_PORT", "18280")) if mode == "proxy" else bport
name = f"{bport}-lab.cube.test"
host = f"{name}:{port}"
CTX = ssl.create_default_context(cafile=os.environ["LAB_CA"]) if TLS else None
_getaddrinfo = socket.getaddrinfo


def _lab_getaddrinfo(h, *a, **kw):
    return _getaddrinfo("127.0.0.1" if isinstance(h, str) and h.endswith(".cube.test") else h, *a, **kw)


socket.getaddrinfo = _lab_getaddrinfo
base = f"https://{host}" if TLS else f"http://127.0.0.1:{port}"
tok = {"cube-traffic-access-token": os.environ["TRAFFIC_TOKEN"]} if mode == "proxy" else {}
PER_CONN = {"date", "connection", "keep-alive", "x-cube-request-id", "x-cube-retcode", "x-lab-extra"}
HOP = {"connection", "keep-alive", "te", "upgrade", "proxy-connection", "transfer-encoding"}


def sha(b):
    return hashlib.sha256(b).hexdigest()[:16]


def pattern(n, seed=0):
    # Byte i is (7i + i//256 + seed) mod 256, which repeats every 65536 bytes:
    # one period made byte by byte, then repeated (8 MiB byte by byte took 3 s).
    period = bytes(((i * 7 + (i >> 8) + seed) & 0xFF) for i in range(min(n, 65536)))
    return (period * (n // 65536 + 1))[:n]


def heads(items):
    cmp, info = [], []
    for n, v in items:
        (info if n.lower() in PER_CONN else cmp).append(f"{n.lower()}: {v}")
    return sorted(cmp), [x for x in info if not x.startswith("x-lab-extra")]


def saw(body, extra=None):
    """The sandbox's view: the echo body, and x-lab-extra (hop-by-hop, the proxy's own headers) as info."""
    return json.loads(body), ({"sandbox": json.loads(urllib.parse.unquote(extra))} if extra else {})


class HTTP10(http.client.HTTPConnection):
    """http.client speaking HTTP/1.0, as old tools and health checkers do."""
    _http_vsn = 10
    _http_vsn_str = "HTTP/1.0"


def recv_until(s, marker):
    """Reads s until marker has arrived or the peer closes."""
    data = b""
    while marker not in data:
        b = s.recv(65536)
        if not b:
            break
        data += b
    return data


class HTTPS10(http.client.HTTPSConnection):
    _http_vsn = 10
    _http_vsn_str = "HTTP/1.0"


def conn(cls=http.client.HTTPConnection):
    # Connect to 127.0.0.1 and send the sandbox's name in Host (no wildcard DNS).
    if TLS:
        cls = HTTPS10 if cls is HTTP10 else http.client.HTTPSConnection
        return cls(name, port, timeout=20, context=CTX)
    return cls("127.0.0.1", port, timeout=20)


def dial(timeout):
    """A raw connection to the sandbox or the proxy, under TLS (SNI: the sandbox's name) when TLS."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return CTX.wrap_socket(s, server_hostname=name) if TLS else s


def request(c, method, path, body=None, headers=None, **kw):
    h = {"Host": host, **tok, **(headers or {})}
    t0 = time.time()
    c.request(method, path, body=body, headers=h, **kw)
    r = c.getresponse()
    data = r.read()
    cmp, info = heads(r.getheaders())
    return r, data, {"status": r.status, "version": r.version, "headers": cmp}, {
        "perConn": info, "ms": int((time.time() - t0) * 1000), "willClose": r.will_close}


scenarios = {}


def scenario(name):
    def reg(f):
        scenarios[name] = f
        return f
    return reg


@scenario("py.http10-chunked")
def _():
    r, data, cmp, info = request(conn(HTTP10), "GET", "/chunked?n=3&ms=50")
    import re
    return {**cmp, "body": re.sub(rb" \d+\n", b"\n", data).decode()}, info


@scenario("py.http10-fixed")
def _():
    r, data, cmp, info = request(conn(HTTP10), "GET", "/fixed?size=70000")
    return {**cmp, "sha": sha(data)}, info


@scenario("py.http10-keepalive")
def _():
    # HTTP/1.0 with Connection: keep-alive on a sized answer: may the client reuse it?
    c = conn(HTTP10)
    out = []
    for i in range(3):
        try:
            r, data, cmp, info = request(c, "GET", f"/fixed?size={100 + i}", headers={"Connection": "keep-alive"})
            out.append([cmp["status"], len(data), r.will_close])
        except Exception as e:  # noqa: BLE001
            out.append(str(e)[:60])
    return {"out": out}, {}


@scenario("py.http10-sse")
def _():
    s = dial(5)
    extra = "".join(f"{k}: {v}\r\n" for k, v in tok.items())
    s.sendall(f"GET /sse?v=reconnect HTTP/1.0\r\nHost: {host}\r\nAccept: text/event-stream\r\n{extra}\r\n".encode())
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    cmp, info = heads([l.split(": ", 1) for l in lines[1:]])
    return {"status": lines[0].split(" ", 1)[1], "headers": cmp, "body": body.decode()}, {"perConn": info, "proto": lines[0][:8]}


def ack(key, n):
    """Acknowledges piece n of the stream under key (backend.mjs, ACK_WAIT_MS):
    True when the sandbox still held the stream open, waiting for it."""
    c = conn()
    c.request("GET", f"/ack?key={key}&n={n}", headers={"Host": host, **tok})
    held = json.loads(c.getresponse().read())["held"]
    c.close()
    return held


@scenario("py.http10-sse-held")
def _():
    # An HTTP/1.0 client's event stream (bare, ended by the close): the first
    # event must arrive while the sandbox holds the stream open, which it does
    # until the client acknowledges the event (prompt), or for 10 s.
    key = f"{mode}-held-{os.getpid()}"
    s = dial(20)
    extra = "".join(f"{k}: {v}\r\n" for k, v in tok.items())
    t0 = time.time()
    s.sendall(f"GET /sse?v=held&key={key} HTTP/1.0\r\nHost: {host}\r\nAccept: text/event-stream\r\n{extra}\r\n".encode())
    data = recv_until(s, b"data: first\n\n")
    ms = int((time.time() - t0) * 1000)
    held = ack(key, 0)
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    cmp, info = heads([l.split(": ", 1) for l in lines[1:]])
    return {"status": lines[0].split(" ", 1)[1], "headers": cmp, "body": body.decode(), "prompt": held}, {"ms": ms, "perConn": info}


@scenario("py.http10-post")
def _():
    r, data, cmp, info = request(conn(HTTP10), "POST", "/echo", body=b"x=1&y=2", headers={"Content-Type": "application/x-www-form-urlencoded"})
    s, si = saw(data, r.getheader("x-lab-extra"))
    return {**cmp, "saw": s}, {**info, **si}


@scenario("py.chunked-upload")
def _():
    # encode_chunked with a generator: chunk sizes as written.
    def gen():
        yield pattern(10)
        yield pattern(100000, 1)
        yield b""  # http.client skips empty chunks (they would end the body)
        yield pattern(3, 2)
    r, data, cmp, info = request(conn(), "POST", "/upload", body=gen(), headers={"Transfer-Encoding": "chunked"}, encode_chunked=True)
    s, si = saw(data, r.getheader("x-lab-extra"))
    return {**cmp, "saw": s}, {**info, **si}


@scenario("py.keepalive-mixed")
def _():
    # One connection: GET, HEAD, 204, 304, POST, GET: every answer framed right.
    c = conn()
    out = []
    socks = set()
    for m, p, b in [("GET", "/fixed?size=3000", None), ("HEAD", "/fixed?size=3000", None), ("GET", "/status?code=204", None),
                    ("GET", "/status?code=304", None), ("POST", "/echo", b"abc"), ("HEAD", "/chunked?n=2&ms=10", None),
                    ("GET", "/chunked?n=2&ms=10", None)]:
        r, data, cmp, info = request(c, m, p, body=b)
        socks.add(id(c.sock))
        out.append([m, p, cmp["status"], len(data)])
    return {"out": out, "connections": len(socks)}, {}


def raw_expect(path, size, send_body_anyway):
    """Expect: 100-continue by hand: head, wait for the interim answer, body."""
    s = dial(10)
    extra = "".join(f"{k}: {v}\r\n" for k, v in tok.items())
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {size}\r\nExpect: 100-continue\r\n{extra}\r\n".encode())
    t0 = time.time()
    s.settimeout(2)
    first = b""
    try:
        while b"\r\n\r\n" not in first:
            b = s.recv(65536)
            if not b:
                break
            first += b
    except socket.timeout:
        pass
    wait_ms = int((time.time() - t0) * 1000)
    got = first.split(b"\r\n", 1)[0].decode()
    s.settimeout(10)
    if got.startswith("HTTP/1.1 100") or (not got and send_body_anyway):
        body = pattern(size)
        try:
            s.sendall(body)
        except OSError as e:
            return {"first": got, "error": str(e)[:60]}, {"waitMs": wait_ms}
        rest = first.split(b"\r\n\r\n", 1)[1]
        data = rest
    else:
        data = first
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
            if b"\r\n\r\n" in data:
                head, _, body = data.partition(b"\r\n\r\n")
                cl = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                if cl and len(body) >= int(cl[0].split(b":")[1]):
                    break
    except OSError as e:
        data += f"<{e.__class__.__name__}>".encode()
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode()
    return {"first": got, "final": status, "body": body.decode(errors="replace")}, {"waitMs": wait_ms}


@scenario("py.expect-100")
def _():
    cmp, info = raw_expect("/upload", 300000, True)
    try:
        s, si = saw(cmp.pop("body"))
        cmp["saw"] = s
        info.update(si)
    except ValueError:
        pass
    cmp["first"] = cmp["first"].replace("HTTP/1.1 ", "")
    return cmp, info


@scenario("py.expect-reject")
def _():
    # The sandbox refuses on the head (413): the client learns it before sending the body.
    return raw_expect("/upload?reject=1", 8 << 20, False)


def trickle(framing):
    """A body sent in two pieces: the second only once the sandbox has the
    first (or 3 s have passed). A proxy that holds the first piece back
    makes the client wait."""
    key = f"{mode}-trickle-{framing}-{os.getpid()}"
    s = dial(10)
    extra = "".join(f"{k}: {v}\r\n" for k, v in tok.items())
    first, second = pattern(1000), pattern(50000, 1)
    if framing == "chunked":
        s.sendall(f"POST /trickle?key={key} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n{extra}\r\n".encode()
                  + b"%x\r\n" % len(first) + first + b"\r\n")
    else:
        s.sendall(f"POST /trickle?key={key} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(first) + len(second)}\r\n{extra}\r\n".encode() + first)
    t0 = time.time()
    arrived = False
    while time.time() - t0 < 3:
        c = conn()
        c.request("GET", f"/stats?key={key}", headers={"Host": host, **tok})
        if any(x.get("n", 0) >= len(first) for x in json.loads(c.getresponse().read())):
            arrived = True
            break
        c.close()
        time.sleep(0.025)
    waited = int((time.time() - t0) * 1000)
    s.sendall(b"%x\r\n" % len(second) + second + b"\r\n0\r\n\r\n" if framing == "chunked" else second)
    data = recv_until(s, b"got")
    return {"firstPieceReachedSandbox": arrived, "answer": data.split(b"\r\n\r\n", 1)[-1].decode()[-20:]}, {"waitedMs": waited}


@scenario("py.trickle-chunked")
def _():
    return trickle("chunked")


@scenario("py.trickle-length")
def _():
    return trickle("length")


@scenario("py.pipelined")
def _():
    # Three requests in one write; the answers must come back whole and in order.
    s = dial(10)
    extra = "".join(f"{k}: {v}\r\n" for k, v in tok.items())
    reqs = "".join(f"GET {p} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n" for p in ("/fixed?size=10", "/status?code=204", "/chunked?n=2&ms=10"))
    s.sendall((reqs + f"GET /fixed?size=5 HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{extra}\r\n").encode())
    f = s.makefile("rb")
    out = []
    for _ in range(4):
        r = http.client.HTTPResponse(s)
        r.fp = f
        r.begin()
        out.append([r.status, len(r.read())])
    return {"out": out}, {}


@scenario("py.urllib-redirect")
def _():
    out = []
    for code in (301, 302, 303, 307, 308):
        req = urllib.request.Request(f"{base}/redirect?code={code}", headers={"Host": host, **tok})
        with urllib.request.urlopen(req, timeout=10, context=CTX) as r:
            body = r.read()
            out.append([code, r.status, r.geturl().split(str(port), 1)[1], json.loads(body)["url"]])
    return {"out": out}, {}


@scenario("py.urllib-post")
def _():
    req = urllib.request.Request(f"{base}/echo", data=pattern(5000), headers={"Host": host, **tok, "Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=10, context=CTX) as r:
        s, si = saw(r.read(), r.getheader("x-lab-extra"))
        cmp, info = heads(r.getheaders())
        return {"status": r.status, "headers": cmp, "saw": s}, {**si, "perConn": info}


@scenario("py.http11-close-delimited")
def _():
    r, data, cmp, info = request(conn(), "GET", "/close")
    return {**cmp, "body": data.decode()}, info


if TLS:
    import tls_clients
    tls_clients.register(scenario, sys.modules[__name__])

for sname, f in scenarios.items():
    if only and not any(sname.startswith(p) for p in only):
        continue
    t0 = time.time()
    try:
        cmp, info = f()
    except Exception as e:  # noqa: BLE001
        cmp, info = {"error": f"{e.__class__.__name__}: {e}"[:120]}, {}
    # Over TLS every scenario is reported as tls/<name>, apart from its plain run.
    # took: its milliseconds, where a run's time goes (compare.mjs ignores it).
    print(json.dumps({"scenario": ("tls/" if TLS else "") + sname, "mode": mode, "took": int((time.time() - t0) * 1000), "cmp": cmp, "info": info}), flush=True)
