package proxy

import (
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A client that half-closes after a complete request (an HTTP/1.0 tool,
// `nc -N`, a load balancer's health check) still reads its answer. Whose
// sandbox refuses the connect at once (an app not listening yet) it gets
// the retried connect's answer, as any client does: the look for a
// departed client is paid, as in the answer's wait, only by a connect
// that took clientCheck or longer. The dial looked after every failed
// connect, so this client was answered 499 client_closed_request within
// a millisecond, the retry skipped and the log blaming the client.
func TestDialHalfClosedClientRefusedConnect(t *testing.T) {
	p, _ := bareProxy(t)
	ln := listen(t, "127.0.0.1:0")
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	client, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// The proxy's side has the FIN, as it has for a request the dial is for.
	testenv.WaitFor(t, 5*time.Second, "the client's FIN", func() bool { return clientHungUp(client) })

	start := time.Now()
	uc, err := p.dial(net.JoinHostPort("127.0.0.1", strconv.Itoa(int(freePort(t)))), client)
	if uc != nil {
		uc.Close()
	}
	var de *dialError
	if !errors.As(err, &de) || de.first == nil {
		t.Fatalf("dial after %s = %v, want a refused connect retried once (*dialError with first), not errClientLeft", time.Since(start), err)
	}
}
