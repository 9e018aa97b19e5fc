package routing

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cube-sandbox/cubeproxy/internal/namedfile"
	"github.com/cube-sandbox/cubeproxy/internal/yamldoc"
	"go.yaml.in/yaml/v3"
)

// MemoryStore is the embedded routing table: routes in memory, optionally
// loaded from and persisted to a routes.yaml file. It is safe for
// concurrent use. Stored routes are shared with callers and must not be
// modified.
type MemoryStore struct {
	mu     sync.RWMutex
	routes map[string]*Route
	path   string // persist file; "" when not persisting
	seq    uint64 // bumped on every change, so writes can be ordered

	// persistMu serialises file writes (done outside mu); written is the
	// seq of the newest snapshot on disk. Every write takes the table as
	// it is when the write starts, so the changes that queued behind one
	// write share the next: at 100k routes a rewrite costs seconds, and a
	// write per change would queue a burst of admin calls for minutes.
	persistMu sync.Mutex
	written   uint64
	// unwritten holds, under mu, the change seq of each delete whose
	// write has not succeeded yet, so that a Remove of an id already
	// gone waits only for its own delete's write (see Remove).
	unwritten map[string]uint64
	// failed is whether the newest write failed: a later Remove of any
	// id retries it.
	failed atomic.Bool
	// beforeWrite, when set (tests), runs under persistMu before a
	// snapshot of change seq is encoded.
	beforeWrite func(seq uint64)
	// beforeRename, when set (tests), runs under persistMu once a write's
	// temporary file is whole, before it is renamed over the routes file;
	// afterRename once it is, before the store records it.
	beforeRename, afterRename func()
	// lookStarted, when set (tests), runs in fileChanged once it has
	// taken the state the store knows, before it looks at the file.
	lookStarted func()
	// fileLimit, when set (tests), replaces namedfile.MaxRoutes as the
	// largest file a write may produce.
	fileLimit int

	// file is the routes file this store was loaded from or last wrote,
	// seen what it was then (nil: there was none) and sum the SHA-256 of
	// its bytes (nil: not known), under mu; see FileChanged. overwrote,
	// when set, is told of a write that replaced a file changed since
	// (see OnOverwrite).
	file      string
	seen      os.FileInfo
	sum       *[sha256.Size]byte
	overwrote func(path string)
	// pending is, under mu, the SHA-256 of the bytes a write in progress
	// is putting in the file (nil: none): from its rename until the store
	// records it, the file is the store's own, not a change.
	pending *[sha256.Size]byte
}

// maxFile is the largest routes file the store writes: the largest
// LoadFile reads.
func (s *MemoryStore) maxFile() int {
	if s.fileLimit > 0 {
		return s.fileLimit
	}
	return namedfile.MaxRoutes
}

// NewMemoryStore returns an empty store that does not persist.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{routes: make(map[string]*Route)}
}

// NewMemoryStoreOfMissingFile returns an empty store for routes file path,
// which LoadFile found missing: FileChanged reports the file once it
// appears (a start without the file served an empty table, and an
// operator who wrote it and sent SIGHUP was told nothing).
func NewMemoryStoreOfMissingFile(path string) *MemoryStore {
	return &MemoryStore{routes: make(map[string]*Route), file: path}
}

// LoadFile reads a routes.yaml file into a new store. The store does not
// write back until SetPersistPath is called. A missing file is an error
// matching fs.ErrNotExist. A file that changed while it was read (the
// opened file's size, time or inode) is read again, up to loadAttempts
// times, then refused: a file cut at a route's end is YAML, and a start
// that read one a writer was not done with (a cp over it, a script
// writing route by route) served the routes written so far as the whole
// table, every other sandbox 404 until the next restart. A file renamed
// over the path meanwhile (persist_routes' own write, a reuse_port
// predecessor's) does not count: what was opened is whole, and the store
// then knows the file as changed since (FileChanged).
func LoadFile(path string) (*MemoryStore, error) {
	return loadFile(path, nil)
}

// loadFile is LoadFile with afterRead (tests; nil otherwise) run after
// each read, before it looks whether the file changed meanwhile.
func loadFile(path string, afterRead func(attempt int)) (*MemoryStore, error) {
	for attempt := 1; ; attempt++ {
		data, before, after, err := readRoutesFile(path, attempt, afterRead)
		if err != nil {
			return nil, fmt.Errorf("load routes: %w", err)
		}
		if sameFileState(before, after) {
			routes, err := decodeRoutes(data)
			if err != nil {
				return nil, fmt.Errorf("load routes %s: %w", path, err)
			}
			sum := sha256.Sum256(data)
			return &MemoryStore{routes: routes, file: path, seen: after, sum: &sum}, nil
		}
		if attempt == loadAttempts {
			return nil, fmt.Errorf("load routes %s: the file changed while it was read, %d times in a row: is something still writing it? Replace it whole (write another file, then mv it over this one) so that no start reads part of it", path, attempt)
		}
	}
}

// readRoutesFile reads the routes file at path, and returns with it the
// opened file's state before and after the read (afterRead, when set, is
// run in between).
func readRoutesFile(path string, attempt int, afterRead func(attempt int)) (data []byte, before, after os.FileInfo, err error) {
	f, before, err := namedfile.Open(path, namedfile.MaxRoutes)
	if err != nil {
		return nil, nil, nil, err
	}
	defer f.Close()
	if data, err = namedfile.ReadFrom(f, path, namedfile.MaxRoutes); err != nil {
		return nil, nil, nil, err
	}
	if afterRead != nil {
		afterRead(attempt)
	}
	if after, err = f.Stat(); err != nil {
		return nil, nil, nil, err
	}
	return data, before, after, nil
}

// loadAttempts is how many times LoadFile reads a file that changes while
// it is read: a writer replacing it whole (a rename) is seen once; one
// that is still writing, after this many reads and parses, is not done.
const loadAttempts = 5

// SetPersistPath makes every later Put and Remove rewrite path atomically
// (temporary file + rename). An empty path turns persistence off.
func (s *MemoryStore) SetPersistPath(path string) {
	s.mu.Lock()
	if path != "" && path != s.file {
		// Not the file loaded: what is there now is the file as known.
		s.file = path
		s.seen, _ = os.Stat(path)
		s.sum = nil
	}
	s.path = path
	s.mu.Unlock()
}

// OnOverwrite sets f to be told, with the file's path, when a write
// replaces a routes file that changed since the store loaded or last
// wrote it: a hand edit, or another process persisting to the same file,
// whose routes the write discards (nil: no one is told).
func (s *MemoryStore) OnOverwrite(f func(path string)) {
	s.mu.Lock()
	s.overwrote = f
	s.mu.Unlock()
}

// FileChanged reports whether the routes file the store was loaded from
// (or persists to) is no longer the file it loaded or last wrote: it
// appeared or went, or its inode, size or modification time differ and
// so do its bytes. The store never reads it again, so such a change is
// not served, and with persistence it is overwritten by the next write.
// It returns the file's path too ("" and false for a store of no file).
func (s *MemoryStore) FileChanged() (path string, changed bool) {
	s.mu.RLock()
	path = s.file
	s.mu.RUnlock()
	if path == "" {
		return "", false
	}
	return path, s.fileChanged(path)
}

// fileChanged reports whether the file at path is no longer the one the
// store loaded or last wrote (FileChanged). Only a file whose state
// differs is read: the same bytes in it (touched, or copied anew: a
// Kubernetes ConfigMap volume swaps every key's file for a new one when
// any key changes) are no change, and its state is taken as the store's,
// so that the next look is a stat again. Reading it costs what the
// store's own write of it costs, and comes only after something else
// touched the file.
//
// The bytes are compared with what the store knows once they are read,
// not before, and with a write in progress (pending) too: a look (SIGHUP)
// during an admin change's write found the store's own file, renamed in
// place before the store recorded it, and called it changed. A file
// replaced while it was read is read again, for the same reason.
func (s *MemoryStore) fileChanged(path string) bool {
	for range loadAttempts {
		s.mu.RLock()
		seen, started := s.seen, s.lookStarted
		s.mu.RUnlock()
		if started != nil {
			started()
		}
		now, err := os.Stat(path)
		if err != nil {
			now = nil
		}
		if sameFileState(seen, now) {
			return false
		}
		if now == nil {
			return true
		}
		data, err := namedfile.Read(path, int64(s.maxFile()))
		if err != nil {
			return true
		}
		if after, err := os.Stat(path); err != nil || !sameFileState(now, after) {
			continue // replaced while read: read the new one
		}
		sum := sha256.Sum256(data)
		s.mu.Lock()
		known := s.sum != nil && sum == *s.sum || s.pending != nil && sum == *s.pending
		if known && s.seen == seen {
			s.seen = now
		}
		s.mu.Unlock()
		return !known
	}
	return true
}

// sameFileState reports whether a and b (nil: no file) are one file,
// unchanged: the same inode, size and modification time.
func sameFileState(a, b os.FileInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// Lookup returns the route for id or ErrNotFound.
func (s *MemoryStore) Lookup(_ context.Context, id string) (*Route, error) {
	s.mu.RLock()
	r, ok := s.routes[id]
	s.mu.RUnlock()
	if !ok {
		return nil, ErrNotFound
	}
	return r, nil
}

// Get returns the route for id.
func (s *MemoryStore) Get(id string) (*Route, bool) {
	s.mu.RLock()
	r, ok := s.routes[id]
	s.mu.RUnlock()
	return r, ok
}

// List returns every route, sorted by id.
func (s *MemoryStore) List() []*Route {
	s.mu.RLock()
	out := make([]*Route, 0, len(s.routes))
	for _, r := range s.routes {
		out = append(out, r)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, byID)
	return out
}

// Page returns, in id order, up to limit routes whose ids sort after
// after ("" starts at the first), and whether more remain; limit 0 means
// all of them. A page is picked in one pass over the table that keeps the
// limit smallest ids in a heap, instead of sorting the whole table for
// every page: at 100k routes that sort took ≈ 26 ms of the proxy's CPU,
// for each page of an operator's listing.
func (s *MemoryStore) Page(after string, limit int) (page []*Route, more bool) {
	s.mu.RLock()
	if limit <= 0 || limit >= len(s.routes) {
		page = make([]*Route, 0, len(s.routes))
		for id, r := range s.routes {
			if id > after {
				page = append(page, r)
			}
		}
		s.mu.RUnlock()
		slices.SortFunc(page, byID)
		return page, false
	}
	page = make([]*Route, 0, limit)
	for id, r := range s.routes {
		switch {
		case id <= after:
		case len(page) < limit:
			page = append(page, r)
			if len(page) == limit {
				for i := limit/2 - 1; i >= 0; i-- {
					siftDown(page, i)
				}
			}
		default:
			more = true
			if id < page[0].ID { // page[0] is the largest id kept
				page[0] = r
				siftDown(page, 0)
			}
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(page, byID)
	return page, more
}

func byID(a, b *Route) int { return strings.Compare(a.ID, b.ID) }

// siftDown restores the max-heap order (by id) of h below i.
func siftDown(h []*Route, i int) {
	for {
		big, l, r := i, 2*i+1, 2*i+2
		if l < len(h) && h[l].ID > h[big].ID {
			big = l
		}
		if r < len(h) && h[r].ID > h[big].ID {
			big = r
		}
		if big == i {
			return
		}
		h[i], h[big] = h[big], h[i]
		i = big
	}
}

// Put validates r like ParseRouteStrict and stores a copy of it, replacing
// any route with the same id. With a persist path, the error reports a
// failed file write; the in-memory change is kept either way.
func (s *MemoryStore) Put(r *Route) error {
	if r == nil {
		return errors.New("put route: nil route")
	}
	nr, err := ParseRouteStrict(r.ID, r.Fields())
	if err != nil {
		return fmt.Errorf("put route %q: %w", r.ID, err)
	}
	s.mu.Lock()
	s.routes[nr.ID] = nr
	s.seq++
	seq, persisting := s.seq, s.path != ""
	s.mu.Unlock()
	if !persisting {
		return nil
	}
	return s.persist(seq)
}

// Remove removes the route for id and reports whether it existed, and the
// error of the file write when the store persists. An id with no route may
// still wait for a write: the call may follow a delete of the same id whose
// write is under way (a client that gave up waiting and retried), and its
// success must mean the file no longer has the route either; after a failed
// write it retries it, whichever id it names (the route is gone from memory,
// not from the file). Otherwise it changes nothing and returns at once,
// without writing or waiting for another change's write.
func (s *MemoryStore) Remove(id string) (bool, error) {
	s.mu.Lock()
	_, ok := s.routes[id]
	seq, persisting := s.seq, s.path != ""
	if ok {
		delete(s.routes, id)
		s.seq++
		seq = s.seq
		if persisting {
			if s.unwritten == nil {
				s.unwritten = make(map[string]uint64)
			}
			s.unwritten[id] = seq
		}
	} else if own, pending := s.unwritten[id]; pending {
		seq = own // this id's delete, not yet on disk: wait for it
	} else if persisting && !s.failed.Load() {
		// Nothing to change, and the file has every delete of id: no
		// write, and no wait behind another change's (seconds at 100k
		// routes) either.
		persisting = false
	}
	s.mu.Unlock()
	if !persisting {
		return ok, nil
	}
	return ok, s.persist(seq)
}

// snapshot is the table as it was after change seq, to be written to path.
type snapshot struct {
	path   string
	seq    uint64
	routes []*Route
}

// snapshot copies the table as it is now, or returns a zero snapshot when
// not persisting. Routes are immutable, so copying the pointers is enough;
// the read lock leaves lookups running while it copies (≈1 ms at 100k).
func (s *MemoryStore) snapshot() snapshot {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.path == "" {
		return snapshot{}
	}
	routes := make([]*Route, 0, len(s.routes))
	for _, r := range s.routes {
		routes = append(routes, r)
	}
	return snapshot{path: s.path, seq: s.seq, routes: routes}
}

// CheckPersistPath reports whether path's directory takes the temporary
// file that every rewrite of path starts with, and whether a rename can
// replace path (not when it is a mount point of its own), so that a store
// that cannot persist is found at startup rather than by each admin change.
func CheckPersistPath(path string) error {
	path = followLink(path)
	if isMountPoint(path) {
		return fmt.Errorf("routes file %s cannot be rewritten: it is a mount point of its own (a single-file bind mount or subPath?), which a rename cannot replace; mount its directory instead", path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), tempPattern(path))
	if err != nil {
		// Not the probe's random name, which would only puzzle, and
		// would make check's message differ from serve's at each run.
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			err = pe.Err
		}
		return fmt.Errorf("routes file %s cannot be rewritten: cannot create a file in %s: %w", path, filepath.Dir(path), err)
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// tempPattern is the os.CreateTemp pattern of the temporary files a
// rewrite of path starts with, in path's directory.
func tempPattern(path string) string {
	return "." + filepath.Base(path) + ".tmp-*"
}

// RemoveStaleTemps removes, from the directory of the file path names
// (through its symlinks, as a rewrite does), the temporary files a
// rewrite of it left behind when the process died before its rename:
// each holds a copy of the table with its traffic tokens, up to the
// routes file's size limit, and nothing else ever removes it. Only
// regular files whose mtime is older than age go: a younger one may be
// the write of a predecessor still running (reuse_port). It returns the
// paths removed, and the errors of those it could not remove or read.
func RemoveStaleTemps(path string, age time.Duration) ([]string, error) {
	path = followLink(path)
	dir := filepath.Dir(path)
	prefix := strings.TrimSuffix(tempPattern(path), "*")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("routes file %s: look for stale temporary files: %w", path, err)
	}
	cutoff := time.Now().Add(-age)
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, prefix) || len(name) == len(prefix) || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // renamed or removed since the listing
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !info.ModTime().Before(cutoff) {
			continue
		}
		p := filepath.Join(dir, name)
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}

// persist returns once change seq is on disk (or not persisting): written
// by this call, or by one that started after the change was made. A
// failed write is reported to its caller only; the changes that waited
// for it try again each.
func (s *MemoryStore) persist(seq uint64) error {
	s.persistMu.Lock()
	defer s.persistMu.Unlock()
	if seq <= s.written {
		return nil // a snapshot taken after the change is already on disk
	}
	snap := s.snapshot()
	if snap.path == "" {
		return nil
	}
	if s.beforeWrite != nil {
		s.beforeWrite(snap.seq)
	}
	slices.SortFunc(snap.routes, byID)
	data, err := encodeRoutes(snap.routes)
	if err != nil {
		s.failed.Store(true)
		return fmt.Errorf("persist routes %s: %w", snap.path, err)
	}
	if limit := s.maxFile(); len(data) > limit {
		// LoadFile refuses a file this large: the next start would fail.
		s.failed.Store(true)
		return fmt.Errorf("persist routes %s: the table (%d routes) would take %d bytes, above the %d bytes a routes file may have (the start reads no more); the file keeps the previous table", snap.path, len(snap.routes), len(data), limit)
	}
	s.mu.RLock()
	overwrote := s.overwrote
	s.mu.RUnlock()
	sum := sha256.Sum256(data)
	replaced := false
	wrote, err := writeFileAtomic(snap.path, data, func() {
		if s.beforeRename != nil {
			s.beforeRename()
		}
		// Looked at once this write's file is whole, just before the
		// rename replaces the routes file: looked at before it was written
		// and synced (seconds at 100k routes), a file renamed in meanwhile
		// (another process persisting to it, a hand edit) was replaced in
		// silence.
		replaced = overwrote != nil && s.fileChanged(snap.path)
		s.mu.Lock()
		s.pending = &sum
		s.mu.Unlock()
	})
	if err != nil {
		s.mu.Lock()
		s.pending = nil
		s.mu.Unlock()
		s.failed.Store(true)
		return fmt.Errorf("persist routes %s: %w", snap.path, err)
	}
	if s.afterRename != nil {
		s.afterRename()
	}
	if replaced {
		overwrote(snap.path)
	}
	s.written = snap.seq
	s.failed.Store(false)
	s.mu.Lock()
	s.seen, s.sum, s.pending = wrote, &sum, nil
	for id, seq := range s.unwritten {
		if seq <= snap.seq {
			delete(s.unwritten, id)
		}
	}
	s.mu.Unlock()
	return nil
}

// followLink returns the file path names through its symlinks, or path
// itself when it is none. A routes file that is a link to the copy kept
// elsewhere must stay one: the rename replaces the file it points to, in
// that file's directory, not the link with a file beside it that leaves
// the target stale. A link to a file not there yet (a fresh data volume)
// is followed too, so the first write creates the target.
func followLink(path string) string {
	path = kernelPath(path)
	for range 40 { // the kernel's own bound on links in a path
		target, err := os.Readlink(path)
		if err != nil {
			return path // not a link, or no file at all
		}
		if !filepath.IsAbs(target) {
			target = filepath.Dir(path) + string(filepath.Separator) + target
		}
		path = kernelPath(target)
	}
	return path
}

// kernelPath cleans path as the kernel resolves it. A ".." element goes
// up from where the directory before it points, when that is a symlink;
// a lexical clean (filepath.Clean, Join, Dir) goes back over the link
// instead, to another directory: with a routes file "../data/routes.yaml"
// in a linked directory, the rewrites went to another file than the one
// loaded, and a restart lost every change. So a path with ".." has its
// directory resolved through its symlinks; one without is cleaned alone,
// as the directories a name passes through do not change what it names.
func kernelPath(path string) string {
	if !slices.Contains(strings.Split(filepath.ToSlash(path), "/"), "..") {
		return filepath.Clean(path)
	}
	dir, file := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return filepath.Clean(path) // a directory not there: no link to go by
	}
	return filepath.Join(resolved, file)
}

// writeFileAtomic replaces path (the file it links to, if a symlink) with
// data so readers see the old or the new file, never a partial one. It
// holds traffic tokens: a new file is 0600, and an existing one keeps its
// owner, group, and owner and group bits but loses the others' (a
// checked-out routes.yaml is 0644: every user of the host could read the
// tokens the admin API writes into it); where its group cannot be kept,
// the group bits go too. It returns the new file's state, as os.Stat of
// path gives it once renamed, for FileChanged. beforeRename, when not nil,
// runs once the temporary file is whole, just before the rename.
func writeFileAtomic(path string, data []byte, beforeRename func()) (os.FileInfo, error) {
	path = followLink(path)
	mode := os.FileMode(0o600)
	old, err := os.Stat(path)
	if err == nil {
		mode = old.Mode().Perm() &^ 0o007
	} else {
		old = nil
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, tempPattern(path))
	if err != nil {
		return nil, err
	}
	tmp := f.Name()
	if old != nil && !keepOwner(f, old) {
		mode &^= 0o070
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	var wrote os.FileInfo
	if err == nil {
		// A rename keeps the inode, size and modification time.
		wrote, err = f.Stat()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && beforeRename != nil {
		beforeRename()
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return nil, err
	}
	// Make the rename itself durable; failure here leaves a valid file.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return wrote, nil
}

// decodeRoutes parses routes.yaml: a mapping "routes" of sandbox id to a
// mapping of Redis field names to scalar values. Unquoted numbers and
// booleans are taken as their literal text.
func decodeRoutes(data []byte) (map[string]*Route, error) {
	routes := make(map[string]*Route)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		// Only for the parser's UTF-8 errors: a syntax error it found
		// before the bad byte is the one to report.
		if line, ok := invalidUTF8Line(data); ok && strings.Contains(err.Error(), "UTF-8") {
			return nil, fmt.Errorf("line %d: not UTF-8 text (%w); save the file as UTF-8", line, err)
		}
		if line, b, ok := controlLine(data); ok && strings.Contains(err.Error(), controlProblem) {
			return nil, fmt.Errorf("line %d: a control character, byte 0x%02x, which YAML does not allow (%w); remove it", line, b, err)
		}
		if tabIndents(data, err) {
			return nil, fmt.Errorf("%w (a tab: YAML indents with spaces only)", err)
		}
		if strings.HasSuffix(err.Error(), keyProblem) {
			if line, ok := firstFailingLine(data, err.Error(), keyLineBudget); ok {
				return nil, fmt.Errorf("line %d: %s (indented unlike the keys around it?); the YAML parser named the line where the mapping it was in starts: %w", line, keyProblem, err)
			}
		}
		return nil, err
	}
	// Two files concatenated, each opening with "---": the second's
	// routes would be missing.
	line, err := yamldoc.NextDocument(dec)
	if err != nil {
		return nil, err
	}
	if line > 0 {
		return nil, fmt.Errorf("line %d: another YAML document after the first (only one is read); put every route under one \"routes\" key", line)
	}
	if len(doc.Content) == 0 || doc.Content[0].ShortTag() == "!!null" {
		return routes, nil // empty file, or a document with nothing in it
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: top level must be a mapping with the key \"routes\"", root.Line)
	}
	seenRoutes := false
	aliased := maxAliasedFields
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Value != "routes" {
			return nil, fmt.Errorf("line %d: unknown top-level key %s (only \"routes\" is allowed)", k.Line, Echo(k.Value))
		}
		if seenRoutes {
			return nil, fmt.Errorf("line %d: key \"routes\" given twice", k.Line)
		}
		seenRoutes = true
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			continue // "routes:" with nothing under it
		}
		if v.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("line %d: \"routes\" must be a mapping of sandbox id to fields", v.Line)
		}
		for j := 0; j+1 < len(v.Content); j += 2 {
			idNode, fieldsNode := v.Content[j], v.Content[j+1]
			if idNode.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: sandbox id must be a string", idNode.Line)
			}
			id := idNode.Value
			if !ValidID(id) {
				return nil, fmt.Errorf("line %d: sandbox id %s must match [a-z0-9][a-z0-9_-]{0,127}", idNode.Line, Echo(id))
			}
			if _, dup := routes[id]; dup {
				return nil, fmt.Errorf("line %d: sandbox %q given twice", idNode.Line, id)
			}
			fields, err := decodeFields(fieldsNode, &aliased)
			if err != nil {
				return nil, fmt.Errorf("sandbox %q: %w", id, err)
			}
			r, err := ParseRouteStrict(id, fields)
			if err != nil {
				return nil, fmt.Errorf("line %d: sandbox %q: %w", idNode.Line, id, err)
			}
			routes[id] = r
		}
	}
	return routes, nil
}

// keyProblem ends the parser's error for a line in a block mapping that
// is no key of it, which names the line where that mapping starts rather
// than that line: "line 1" for a slip anywhere under "routes".
const keyProblem = "did not find expected key"

// keyLineBudget bounds the search for the line of a keyProblem: it takes
// about 20 parses of up to the whole file, ≈1 s each at 100k routes (a
// slip near the end of one was found in 19 s), and the start is failing
// anyway.
const keyLineBudget = 30 * time.Second

// firstFailingLine returns the first line of data at which the parser
// fails with msg, the error it gives for the whole of data: the smallest
// number of leading lines that fail so, found by bisection. A block
// mapping cut after any line is YAML, so the lines before the slip parse
// and every prefix that holds it fails alike; a cut inside a quoted or
// flow value fails with another message, which counts as parsing. It
// gives up, false, when the parses take more than budget.
func firstFailingLine(data []byte, msg string, budget time.Duration) (int, bool) {
	var ends []int // ends[i] is the offset just past line i+1
	for i, c := range data {
		if c == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		ends = append(ends, len(data))
	}
	deadline := time.Now().Add(budget)
	lo, hi := 0, len(ends) // the first hi lines fail with msg; the first lo do not
	for hi-lo > 1 {
		if time.Now().After(deadline) {
			return 0, false
		}
		mid := lo + (hi-lo)/2
		var doc yaml.Node
		if err := yaml.NewDecoder(bytes.NewReader(data[:ends[mid-1]])).Decode(&doc); err != nil && err.Error() == msg {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, hi > 0
}

// invalidUTF8Line returns the line of the first byte of data that is not
// UTF-8, for the parser's error, which names none (in a 100k-route file,
// nothing to look for). A file the parser reads as UTF-16, by its
// byte-order mark, has none.
func invalidUTF8Line(data []byte) (int, bool) {
	if bytes.HasPrefix(data, []byte{0xff, 0xfe}) || bytes.HasPrefix(data, []byte{0xfe, 0xff}) {
		return 0, false
	}
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size == 1 {
			return 1 + bytes.Count(data[:i], []byte{'\n'}), true
		}
		i += size
	}
	return 0, false
}

// tabIndents reports whether err is the parser's "cannot start any
// token" at a line that a tab indents, which looks like the spaces around
// it. @, ` and % (a directive's, only at a line's start) cannot start a
// token either: a tab elsewhere on their line is not blamed for them.
func tabIndents(data []byte, err error) bool {
	var line int
	if _, scanErr := fmt.Sscanf(err.Error(), "yaml: line %d: found character that cannot start any token", &line); scanErr != nil || line < 1 {
		return false
	}
	l := data
	for range line - 1 {
		nl := bytes.IndexByte(l, '\n')
		if nl < 0 {
			return false
		}
		l = l[nl+1:]
	}
	if nl := bytes.IndexByte(l, '\n'); nl >= 0 {
		l = l[:nl]
	}
	indent := l[:len(l)-len(bytes.TrimLeft(l, " \t"))]
	return bytes.IndexByte(indent, '\t') >= 0 || bytes.IndexByte(l, '\t') >= 0 && !bytes.ContainsAny(l, "@`%")
}

// controlProblem is the parser's error for a character YAML does not
// allow in a file, which names no line.
const controlProblem = "control characters are not allowed"

// controlLine returns the line of the first character of data that YAML
// does not allow (a C0 control other than tab, LF and CR, DEL, a C1
// control other than NEL, U+FFFE or U+FFFF, as the parser's reader
// checks), and its first byte. A file in UTF-16 is not looked at:
// its bytes are not its characters.
func controlLine(data []byte) (line int, b byte, ok bool) {
	if bytes.HasPrefix(data, []byte{0xff, 0xfe}) || bytes.HasPrefix(data, []byte{0xfe, 0xff}) {
		return 0, 0, false
	}
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == '\t' || r == '\n' || r == '\r' || r == 0x85:
		case r < 0x20 || r >= 0x7f && r < 0xa0 || r == 0xfffe || r == 0xffff:
			return 1 + bytes.Count(data[:i], []byte{'\n'}), data[i], true
		}
		i += size
	}
	return 0, 0, false
}

// decodeFields reads a route's fields: a mapping of field name to scalar,
// through YAML's aliases ("HostIP: *node1", a route "b: *a") and merge
// keys ("<<: *base", "<<: [*a, *b]"), as the config file is read. A
// mapping's own fields win over merged ones, and an earlier mapping
// merged over a later one, as YAML's merge key has it. Fields reached
// through an alias count against *aliased, so that aliases nested level
// on level (each doubling what the one above stands for) cannot make a
// small file take unbounded work.
func decodeFields(n *yaml.Node, aliased *int) (map[string]string, error) {
	fields := make(map[string]string, len(n.Content)/2)
	if err := addFields(fields, n, nil, false, aliased); err != nil {
		return nil, err
	}
	return fields, nil
}

// maxAliasedFields bounds the fields a routes file may reach through
// aliases: a 100k-route file whose every route merges a base of a few
// fields stays far below it.
const maxAliasedFields = 1 << 22

// maxMergeDepth bounds how deep merge keys nest (a base merged into one
// merged into a route is 2).
const maxMergeDepth = 32

// addFields adds the fields of mapping n to fields. mergedInto are the
// mappings n is merged into, the route's own first: nil for the route's
// own mapping, whose fields may not repeat; a merged mapping's fill only
// those not set yet. viaAlias is whether n was reached through an alias.
func addFields(fields map[string]string, n *yaml.Node, mergedInto []*yaml.Node, viaAlias bool, aliased *int) error {
	line := n.Line // of the alias, where one is used: the line to fix
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n, viaAlias = n.Alias, true
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: fields must be a mapping of field name to value", line)
	}
	// The parser lets an anchored mapping hold an alias of itself
	// ("&x {<<: *x}"): followed, it recursed until the stack ran out.
	if slices.Contains(mergedInto, n) {
		return fmt.Errorf("line %d: a merge key (<<) merges a mapping into itself", line)
	}
	if len(mergedInto) >= maxMergeDepth {
		return fmt.Errorf("line %d: merge keys (<<) nested more than %d deep", line, maxMergeDepth)
	}
	own := mergedInto == nil
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if viaAlias {
			if *aliased--; *aliased < 0 {
				return fmt.Errorf("line %d: aliases stand for more than %d fields in all; write the routes out", v.Line, maxAliasedFields)
			}
		}
		if k.Kind != yaml.ScalarNode {
			return fmt.Errorf("line %d: field name must be a string", k.Line)
		}
		if k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		if _, dup := fields[k.Value]; dup {
			if own {
				return fmt.Errorf("line %d: field %s given twice", k.Line, Echo(k.Value))
			}
			continue // set by a mapping that wins over this one
		}
		value := v
		if value.Kind == yaml.AliasNode && value.Alias != nil {
			value = value.Alias
		}
		if value.Kind != yaml.ScalarNode || value.Tag == "!!null" {
			return fmt.Errorf("line %d: field %s: value must be a string", v.Line, Echo(k.Value))
		}
		fields[k.Value] = value.Value
	}
	for _, m := range merges {
		list, line, via := []*yaml.Node{m}, m.Line, viaAlias
		if m.Kind == yaml.AliasNode && m.Alias != nil {
			m, via = m.Alias, true
		}
		if m.Kind == yaml.SequenceNode {
			list = m.Content
		}
		for _, e := range list {
			target := e
			if target.Kind == yaml.AliasNode && target.Alias != nil {
				target = target.Alias
			}
			if target.Kind != yaml.MappingNode {
				return fmt.Errorf("line %d: a merge key (<<) takes a mapping or a list of mappings, such as <<: *base", line)
			}
			if err := addFields(fields, e, append(mergedInto, n), via, aliased); err != nil {
				return err
			}
		}
	}
	return nil
}

// fieldOrder is the order fields are written in; ports follow, ascending.
var fieldOrder = [...]string{FieldHostIP, FieldSandboxIP, FieldCreatedAt, FieldAllowPublicTraffic, FieldTrafficAccessToken, FieldMaskRequestHost}

const routesHeader = "Routing table of the embedded store. CubeProxy rewrites this file on\n" +
	"admin API changes; values are the Redis hash fields, as strings."

// encodeRoutes renders routes (sorted by id) in the routes.yaml format:
// fields in the order of Fields' names (HostIP, SandboxIP, CreatedAt,
// AllowPublicTraffic, TrafficAccessToken, MaskRequestHost), then ports
// ascending, every value double-quoted. It writes the text itself rather
// than through yaml.Node and the yaml encoder: every admin change with
// persist_routes rewrites the whole table, and at 100k routes the encoder
// took 9 s and 3.5 GB of allocations (a 2.4 GB heap) for a 29 MB file.
func encodeRoutes(routes []*Route) ([]byte, error) {
	// ≈ 290 bytes per route with a token and three ports.
	buf := make([]byte, 0, 256+320*len(routes))
	for line := range strings.SplitSeq(routesHeader, "\n") {
		buf = append(buf, "# "...)
		buf = append(buf, line...)
		buf = append(buf, '\n')
	}
	if len(routes) == 0 {
		return append(buf, "routes: {}\n"...), nil
	}
	buf = append(buf, "routes:\n"...)
	var ports []int
	var err error
	for _, r := range routes {
		buf = append(buf, "  "...)
		if buf, err = appendYAMLKey(buf, r.ID); err != nil {
			return nil, fmt.Errorf("sandbox id %q: %w", r.ID, err)
		}
		buf = append(buf, ':')
		mark := len(buf)
		// Fields is the one mapping of a route to its fields, shared with
		// Redis and the admin API: a field added there is written here.
		fields := r.Fields()
		named := 0
		for _, name := range fieldOrder {
			v, ok := fields[name]
			if !ok {
				continue
			}
			named++
			buf = append(buf, "\n    "...)
			buf = append(buf, name...)
			buf = append(buf, ": "...)
			if buf, err = appendYAMLQuoted(buf, v); err != nil {
				return nil, fmt.Errorf("sandbox %q: %w", r.ID, err)
			}
		}
		if named+len(r.Ports) != len(fields) {
			return nil, fmt.Errorf("sandbox %q: a route field missing from fieldOrder would not be written", r.ID)
		}
		ports = ports[:0]
		for c := range r.Ports {
			ports = append(ports, int(c))
		}
		slices.Sort(ports)
		for _, c := range ports {
			buf = append(buf, "\n    \""...)
			buf = strconv.AppendInt(buf, int64(c), 10)
			buf = append(buf, "\": \""...)
			buf = strconv.AppendInt(buf, int64(r.Ports[uint16(c)]), 10)
			buf = append(buf, '"')
		}
		if len(buf) == mark {
			buf = append(buf, " {}"...) // no field at all
		}
		buf = append(buf, '\n')
	}
	return buf, nil
}

// yamlReserved are the plain scalars a YAML 1.1 or 1.2 reader takes for a
// boolean or null; an id spelled so is quoted.
var yamlReserved = [...]string{"y", "n", "yes", "no", "on", "off", "true", "false", "null"}

// appendYAMLKey appends a sandbox id as a mapping key: plain when it
// starts with a letter and is made of [a-z0-9_-] only (never a number,
// boolean or null to any YAML reader), double-quoted otherwise.
func appendYAMLKey(buf []byte, id string) ([]byte, error) {
	plain := id != "" && id[0] >= 'a' && id[0] <= 'z' && !slices.Contains(yamlReserved[:], id)
	for i := 0; plain && i < len(id); i++ {
		c := id[i]
		plain = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	if plain {
		return append(buf, id...), nil
	}
	return appendYAMLQuoted(buf, id)
}

// appendYAMLQuoted appends s as a YAML double-quoted scalar: '"' and '\\'
// escaped, and every rune that is not printable (controls, line and
// paragraph separators, a byte-order mark) written as an escape, so the
// value reads back byte for byte. Text that is not UTF-8 cannot be.
func appendYAMLQuoted(buf []byte, s string) ([]byte, error) {
	if !utf8.ValidString(s) {
		return buf, errors.New("value is not valid UTF-8")
	}
	const hex = "0123456789abcdef"
	buf = append(buf, '"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			buf = append(buf, '\\', byte(c))
		case c >= ' ' && c < utf8.RuneSelf && c != 0x7f:
			buf = append(buf, byte(c))
		case c >= utf8.RuneSelf && unicode.IsPrint(c):
			buf = utf8.AppendRune(buf, c)
		case c <= 0xff:
			buf = append(buf, '\\', 'x', hex[c>>4], hex[c&0xf])
		case c <= 0xffff:
			buf = append(buf, '\\', 'u', hex[c>>12], hex[c>>8&0xf], hex[c>>4&0xf], hex[c&0xf])
		default:
			buf = append(buf, '\\', 'U')
			for shift := 28; shift >= 0; shift -= 4 {
				buf = append(buf, hex[c>>shift&0xf])
			}
		}
	}
	return append(buf, '"'), nil
}
