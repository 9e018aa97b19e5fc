package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// newStdMux serves the endpoints that need net/http: WebSocket echo and MCP.
func newStdMux(maxHold time.Duration) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) { wsEcho(w, r, maxHold) })
	mux.Handle("/mcp", newMCPHandler(maxHold))
	mux.HandleFunc("/small", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(smallBody)
	})
	return mux
}

// wsEcho echoes every message back with the same type until the peer closes
// or maxHold passes.
func wsEcho(w http.ResponseWriter, r *http.Request, maxHold time.Duration) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(wsMaxMessage)
	ctx, cancel := context.WithTimeout(r.Context(), maxHold)
	defer cancel()
	buf := make([]byte, wsMaxMessage)
	for {
		typ, rd, err := c.Reader(ctx)
		if err != nil {
			return
		}
		n, err := readAll(rd, buf)
		if err != nil {
			return
		}
		// One Write call sends one FIN frame; a Writer+Close pair would send two.
		if err := c.Write(ctx, typ, buf[:n]); err != nil {
			return
		}
	}
}

// wsMaxMessage bounds echoed messages so the echo buffer is allocated once.
const wsMaxMessage = 64 << 10

// readAll reads r to EOF into buf without allocating.
func readAll(r io.Reader, buf []byte) (int, error) {
	n := 0
	for {
		m, err := r.Read(buf[n:])
		n += m
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if n == len(buf) {
			return n, io.ErrShortBuffer
		}
	}
}

// progressArgs are the arguments of the "progress" tool.
type progressArgs struct {
	Steps int `json:"steps" jsonschema:"number of progress notifications to send"`
}

// newMCPHandler returns a stateful streamable-HTTP MCP server with one tool,
// "progress", that streams Steps progress notifications before its result.
func newMCPHandler(maxHold time.Duration) http.Handler {
	srv := mcp.NewServer(&mcp.Implementation{Name: "bench-backend", Version: "v1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "progress", Description: "streams progress notifications"},
		func(ctx context.Context, req *mcp.CallToolRequest, in progressArgs) (*mcp.CallToolResult, any, error) {
			steps := min(max(in.Steps, 0), 1000)
			if tok := req.Params.GetProgressToken(); tok != nil {
				for i := range steps {
					err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
						ProgressToken: tok, Progress: float64(i + 1), Total: float64(steps), Message: "step",
					})
					if err != nil {
						return nil, nil, err
					}
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("ok", 8)}}}, nil, nil
		})
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		DisableLocalhostProtection: true, // requests arrive with sandbox Host names over loopback
		SessionTimeout:             maxHold,
	})
}
