//go:build unix

package namedfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// ReadOnce's pipe errors are matched as Read's are: a pipe above the limit
// is ErrTooLarge and an empty one ErrEmptyPipe, whatever the wording, so a
// caller can tell them apart from an I/O error.
func TestReadOncePipeErrorsMatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write []byte
		is    error
	}{
		{"above the limit", make([]byte, 17), ErrTooLarge},
		{"empty", nil, ErrEmptyPipe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			go func() {
				w.Write(tc.write)
				w.Close()
			}()
			path := fmt.Sprintf("/dev/fd/%d", r.Fd())
			if _, err := ReadOnce(path, 16); !errors.Is(err, tc.is) {
				t.Fatalf("ReadOnce = %v, want an error matching %v", err, tc.is)
			}
		})
	}
}

// A FIFO whose writer never comes is given up when ctx ends, with an error
// that wraps ctx's: the caller tells "stopped" from a bad file by it.
func TestReadOnceContextWrapsCtxErr(t *testing.T) {
	fifo := testenv.Mkfifo(t, t.TempDir(), "cfg.fifo")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() {
		_, err := ReadOnceContext(ctx, fifo, MaxSmall)
		done <- err
	}()
	err := testenv.Recv(t, done, 10*time.Second, "ReadOnceContext to give up")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("ReadOnceContext = %v, want an error matching context.Canceled", err)
	}
	// Be the writer the background read waits for, so it ends.
	if f, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
		f.Close()
	}
}
