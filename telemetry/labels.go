package telemetry

// RouteKind classifies a request for metric labels and span attributes.
type RouteKind uint8

// Route kinds. Out-of-range values are recorded as RouteError.
const (
	RouteHTTP      RouteKind = iota // plain HTTP forwarded to a sandbox (also chunked streams)
	RouteSSE                        // text/event-stream response
	RouteWebSocket                  // upgraded connection spliced both ways
	RouteError                      // answered by the proxy itself (bad host, auth, unknown sandbox...)
	numRouteKinds
)

var routeKindNames = [numRouteKinds]string{"http", "sse", "websocket", "error"}

// String returns the label value of k.
func (k RouteKind) String() string { return routeKindNames[k.index()] }

func (k RouteKind) index() int {
	if k >= numRouteKinds {
		return int(RouteError)
	}
	return int(k)
}

// CacheResult is the outcome of a route-cache lookup.
type CacheResult uint8

// Cache results. CacheNone means the request never reached the cache
// (it is not counted); out-of-range values count as CacheMiss.
const (
	CacheNone        CacheResult = iota
	CacheHit                     // fresh positive entry
	CacheMiss                    // not cached, the store was asked
	CacheNegativeHit             // cached "unknown sandbox"
	CacheStale                   // expired entry served because the store was unavailable
	numCacheResults
)

var cacheResultNames = [numCacheResults]string{"", "hit", "miss", "negative_hit", "stale"}

// String returns the label value of r ("" for CacheNone).
func (r CacheResult) String() string { return cacheResultNames[r.index()] }

func (r CacheResult) index() int {
	if r >= numCacheResults {
		return int(CacheMiss)
	}
	return int(r)
}

// StoreKind names the routing store behind the cache.
type StoreKind uint8

// Store kinds. Out-of-range values are recorded as StoreMemory.
const (
	StoreMemory StoreKind = iota // embedded memory/file store
	StoreRedis                   // Redis (standalone, Sentinel or Cluster)
	numStoreKinds
)

var storeKindNames = [numStoreKinds]string{"memory", "redis"}

// String returns the label value of s.
func (s StoreKind) String() string { return storeKindNames[s.index()] }

func (s StoreKind) index() int {
	if s >= numStoreKinds {
		return int(StoreMemory)
	}
	return int(s)
}

// Auth rejection reasons accepted by Metrics.AuthRejected. They equal the
// auth package's rejection codes (auth.Code*), plus AuthCredentialRevoked
// for a request a route change refused for the credential it came with
// (the proxy's 403 credential_revoked) and AuthAdmin for a refused admin
// token; any other string is counted as AuthOther.
const (
	AuthTrafficTokenMissing       = "traffic_token_missing"
	AuthTrafficTokenInvalid       = "traffic_token_invalid"
	AuthTrafficTokenNotConfigured = "traffic_token_not_configured"
	AuthSignedTokenMalformed      = "signed_token_malformed"
	AuthSignedTokenInvalid        = "signed_token_invalid"
	AuthSignedTokenWrongTarget    = "signed_token_wrong_target"
	AuthSignedTokenExpired        = "signed_token_expired"
	AuthSignedCookieForeignOrigin = "signed_cookie_foreign_origin"
	AuthCredentialRevoked         = "credential_revoked"
	AuthAdmin                     = "admin"
	AuthOther                     = "other"
)

// authReasons is the fixed label set of cubeproxy_auth_rejections_total;
// authReasonIndex must agree with its order.
var authReasons = [...]string{
	AuthTrafficTokenMissing,
	AuthTrafficTokenInvalid,
	AuthTrafficTokenNotConfigured,
	AuthSignedTokenMalformed,
	AuthSignedTokenInvalid,
	AuthSignedTokenWrongTarget,
	AuthSignedTokenExpired,
	AuthSignedCookieForeignOrigin,
	AuthCredentialRevoked,
	AuthAdmin,
	AuthOther,
}

// authReasonIndex maps a reason to its slot in authReasons; a switch keeps
// the lookup allocation-free and the label set bounded.
func authReasonIndex(reason string) int {
	switch reason {
	case AuthTrafficTokenMissing:
		return 0
	case AuthTrafficTokenInvalid:
		return 1
	case AuthTrafficTokenNotConfigured:
		return 2
	case AuthSignedTokenMalformed:
		return 3
	case AuthSignedTokenInvalid:
		return 4
	case AuthSignedTokenWrongTarget:
		return 5
	case AuthSignedTokenExpired:
		return 6
	case AuthSignedCookieForeignOrigin:
		return 7
	case AuthCredentialRevoked:
		return 8
	case AuthAdmin:
		return 9
	}
	return 10
}

// StreamEnd is why a streamed response or a WebSocket tunnel ended, the
// reason label of cubeproxy_streams_ended_total. Its head (a 2xx, a 101)
// went out long before, so the request counters cannot tell these apart.
type StreamEnd uint8

// Stream end reasons. Out-of-range values are recorded as StreamError.
const (
	StreamComplete     StreamEnd = iota // the body ended or the tunnel closed as either side chose
	StreamClient                        // the client hung up before the body's end
	StreamSandbox                       // the sandbox reset its side or broke its framing
	StreamTimeout                       // the idle timeout, or a client that did not take a write in time
	StreamDrain                         // the drain: its deadline cut it, or it ended a GET event stream at its start
	StreamKilled                        // the sandbox was killed (admin meta/delete)
	StreamError                         // anything else
	StreamRouteChanged                  // a change of the sandbox's route revoked its credential or moved its backend
	numStreamEnds
)

var streamEndNames = [numStreamEnds]string{"complete", "client", "sandbox", "timeout", "drain", "killed", "error", "route_changed"}

// String returns the label value of e.
func (e StreamEnd) String() string { return streamEndNames[e.index()] }

func (e StreamEnd) index() int {
	if e >= numStreamEnds {
		return int(StreamError)
	}
	return int(e)
}

// Status classes; anything outside 100..599 is "other".
const numStatusClasses = 6

var statusClassNames = [numStatusClasses]string{"other", "1xx", "2xx", "3xx", "4xx", "5xx"}

func statusClassIndex(status int) int {
	if status < 100 || status > 599 {
		return 0
	}
	return status / 100
}
