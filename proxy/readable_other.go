//go:build !unix

package proxy

import "errors"

// canWaitReadable: without MSG_PEEK SSE streams stay on fasthttp's writer.
const canWaitReadable = false

func (c *upstreamConn) waitReadable() error {
	return errors.New("waitReadable is not supported on this platform")
}
