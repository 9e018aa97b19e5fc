package main

import "bytes"

// sseParser follows the backend's event format, "data: <19-digit unix
// nanos> <padding>\n\n", across arbitrary read boundaries without copying.
type sseParser struct {
	pos int   // bytes of the current event seen so far
	ts  int64 // send time being parsed
	nl  int   // newlines seen in the current event
	bad bool  // input did not follow the format
}

const (
	ssePrefixLen = len("data: ")
	sseStampEnd  = ssePrefixLen + 19
)

// feed parses b and calls onEvent with the send time of every event that
// completes in it; it returns the number of completed events.
func (p *sseParser) feed(b []byte, onEvent func(sentNanos int64)) int {
	events := 0
	for i := 0; i < len(b); {
		if p.pos < sseStampEnd {
			c := b[i]
			switch {
			case p.pos < ssePrefixLen:
				if c != "data: "[p.pos] {
					p.bad = true
				}
			case c >= '0' && c <= '9':
				p.ts = p.ts*10 + int64(c-'0')
			default:
				p.bad = true
			}
			p.pos++
			i++
			continue
		}
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			p.pos += len(b) - i
			break
		}
		i += j + 1
		p.pos += j + 1
		p.nl++
		if p.nl == 2 {
			events++
			if onEvent != nil {
				onEvent(p.ts)
			}
			*p = sseParser{bad: p.bad}
		}
	}
	return events
}
