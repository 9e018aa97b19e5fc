// Package routing maps a request to its sandbox: it parses the target from
// the Host (or shared-host headers), models a sandbox's route, and holds the
// route stores and the cache in front of them.
package routing

import (
	"context"
	"errors"
)

// ErrNotFound is returned by stores (and the cache) when no route exists for a sandbox id.
var ErrNotFound = errors.New("sandbox not found")

// Store is the routing table behind the cache: the embedded MemoryStore or Redis.
// Lookup returns ErrNotFound for an unknown id, a *FieldError for a route
// whose data is invalid, and any other error when the store is unavailable.
type Store interface {
	Lookup(ctx context.Context, id string) (*Route, error)
}
