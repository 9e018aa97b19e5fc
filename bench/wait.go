package main

import (
	"flag"
	"fmt"
	"time"
)

// runWait polls until a GET through the subject returns 200, so compare.sh
// starts measuring only once routing works end to end.
func runWait(args []string) error {
	fs := flag.NewFlagSet("wait", flag.ContinueOnError)
	var o options
	o.register(fs, 20001)
	path := fs.String("path", "/small", "path to request")
	timeout := fs.Duration("timeout", 20*time.Second, "give up after this long")
	if err := o.parse(fs, args); err != nil {
		return err
	}
	req := buildGET(*path, o.host(o.id))
	end := time.Now().Add(*timeout)
	var last error
	for time.Now().Before(end) {
		rc := newRawConn(o.addr, 16<<10)
		rc.deadline = time.Now().Add(2 * time.Second)
		status, _, err := rc.roundTrip(req)
		rc.close()
		if err == nil && status == 200 {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("status %d", status)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("wait %s host %s: not ready after %s: %w", o.addr, o.host(o.id), *timeout, last)
}
