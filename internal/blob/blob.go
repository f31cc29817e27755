// Package blob is the shared blob store: where templates and snapshots go
// so that any worker (and any server) of an installation can read what
// another wrote. One interface, two backends, chosen by URL (Open):
//
//	file:///DIR                                a directory; several workers
//	                                           that mount the same directory
//	                                           (NFS, a shared disk) share it
//	s3://BUCKET[/PREFIX]?endpoint=URL&region=R S3-compatible object storage
//
// Objects are immutable once written and written atomically: a reader sees
// a whole object or none (the file backend writes a temporary file, fsyncs
// and renames it; S3 publishes an object when its PUT or its multipart
// upload completes). Keys are slash-separated paths of lower-case letters,
// digits and ".-_", never absolute and never with an empty, "." or ".."
// element (ValidKey), so no key escapes the directory or prefix.
//
// The store holds no secrets in its URL: the S3 backend takes its
// credentials from the environment (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or the shared credentials file,
// as every S3 tool does. What is stored is checked by its reader (package
// snapshot verifies sizes and sha256 of every artifact it downloads): the
// blob store is shared storage, not a trusted party.
package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
)

// ErrNotFound: no object under that key.
var ErrNotFound = fmt.Errorf("blob not found: %w", model.ErrNotFound)

// Object describes one stored object.
type Object struct {
	Key      string
	Size     int64
	Modified time.Time
}

// Store is a blob store. Its methods are safe for concurrent use.
type Store interface {
	// Put stores size bytes read from r under key, replacing what was
	// there. When r is an *os.File a backend may upload parts of it in
	// parallel. Fewer or more bytes than size fail the Put
	// and leave nothing under key that was not there before.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Get opens the object under key (ErrNotFound when there is none) and
	// returns its size; the caller closes it.
	Get(ctx context.Context, key string) (io.ReadCloser, int64, error)
	// Stat returns the object under key without its content.
	Stat(ctx context.Context, key string) (Object, error)
	// Delete removes the object under key; an absent key is not an error.
	Delete(ctx context.Context, key string) error
	// List returns the objects whose keys start with prefix, in key order.
	List(ctx context.Context, prefix string) ([]Object, error)
	// String is the store's URL without credentials: for logs, and as the
	// identity workers report so the server knows which of them share one.
	String() string
}

// Open returns the store rawURL names (see the package comment). An empty
// URL is an error: the caller decides what no blob store means.
func Open(ctx context.Context, rawURL string) (Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, model.Errorf(model.ErrInvalid, "blob store URL %q: %v", rawURL, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, model.Errorf(model.ErrInvalid, "blob store URL %q: a file URL names a local directory (file:///DIR), not host %q", rawURL, u.Host)
		}
		if u.RawQuery != "" {
			return nil, model.Errorf(model.ErrInvalid, "blob store URL %q: a file URL takes no parameters", rawURL)
		}
		return OpenDir(u.Path)
	case "s3":
		return openS3(ctx, u)
	case "":
		return nil, model.Errorf(model.ErrInvalid, "blob store URL %q has no scheme: use file:///DIR or s3://BUCKET?endpoint=URL&region=R", rawURL)
	default:
		return nil, model.Errorf(model.ErrInvalid, "blob store URL %q: unknown scheme %q (file or s3)", rawURL, u.Scheme)
	}
}

// MaxKeyLen bounds a key.
const MaxKeyLen = 512

// ValidKey returns nil when key is a valid key (see the package comment);
// else an error wrapping model.ErrInvalid.
func ValidKey(key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return model.Errorf(model.ErrInvalid, "blob key of %d bytes (1 to %d)", len(key), MaxKeyLen)
	}
	for _, el := range strings.Split(key, "/") {
		if el == "" || el == "." || el == ".." {
			return model.Errorf(model.ErrInvalid, "blob key %.80q has an empty, \".\" or \"..\" element", key)
		}
		if strings.HasPrefix(el, ".") {
			// Dot names are the file backend's own (temporary files).
			return model.Errorf(model.ErrInvalid, "blob key %.80q has an element starting with \".\"", key)
		}
	}
	for _, c := range key {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '/', c == '.', c == '-', c == '_':
		default:
			return model.Errorf(model.ErrInvalid, "blob key %.80q has character %q (lower-case letters, digits, \"/.-_\")", key, c)
		}
	}
	return nil
}

// validPrefix is ValidKey for a List prefix: empty, or a key optionally
// ending in "/".
func validPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return ValidKey(strings.TrimSuffix(prefix, "/"))
}

// countingReader counts what it reads and fails the read that reaches
// limit when more follows (a reader longer than the size given: a backend
// that reads exactly size bytes would store a truncated object).
type countingReader struct {
	r     io.Reader
	n     int64
	limit int64
	extra bool // more than limit bytes were there
}

var errTooLong = errors.New("more bytes than the size given")

func (c *countingReader) Read(p []byte) (int, error) {
	if room := c.limit - c.n; int64(len(p)) > room+1 {
		p = p[:room+1]
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.limit {
		c.extra = true
		return n, errTooLong
	}
	if c.n == c.limit && err == nil {
		var one [1]byte
		m, perr := io.ReadFull(c.r, one[:])
		if m > 0 {
			c.extra = true
			return n, errTooLong
		}
		if perr != nil && !errors.Is(perr, io.EOF) {
			return n, perr
		}
		return n, io.EOF
	}
	return n, err
}
