package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/airlock/airlock/internal/model"
)

// S3 upload tuning: objects above PartSize go up in parts of PartSize,
// UploadThreads at once (from an io.ReaderAt such as a snapshot's file).
const (
	PartSize      = 16 << 20
	UploadThreads = 4
)

// S3 is the S3-compatible backend (minio-go: a maintained client that
// speaks to AWS and to every S3-compatible server, does parallel multipart
// uploads from an io.ReaderAt, and pulls few dependencies).
type S3 struct {
	c      *minio.Client
	bucket string
	prefix string // "" or ends in "/"
	url    string // without credentials
}

var _ Store = (*S3)(nil)

// openS3 opens s3://BUCKET[/PREFIX]?endpoint=URL&region=R. endpoint is
// http(s)://host[:port] (default: AWS in region); addressing is path-style
// unless the endpoint is AWS. The bucket is created when it does not exist.
func openS3(ctx context.Context, u *url.URL) (*S3, error) {
	bad := func(format string, args ...any) error {
		return model.Errorf(model.ErrInvalid, "blob store URL s3://%s: %s", u.Host, fmt.Sprintf(format, args...))
	}
	if u.User != nil {
		return nil, bad("credentials do not go in the URL: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	}
	bucket := u.Host
	if bucket == "" {
		return nil, bad("no bucket (s3://BUCKET?endpoint=URL&region=R)")
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		if err := ValidKey(prefix); err != nil {
			return nil, bad("prefix: %v", err)
		}
		prefix += "/"
	}
	q := u.Query()
	for k := range q {
		if k != "endpoint" && k != "region" {
			return nil, bad("unknown parameter %q (endpoint, region)", k)
		}
	}
	region := q.Get("region")
	endpoint := q.Get("endpoint")
	secure := true
	host := "s3.amazonaws.com"
	if region != "" {
		host = "s3." + region + ".amazonaws.com"
	}
	if endpoint != "" {
		e, err := url.Parse(endpoint)
		if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" || (e.Path != "" && e.Path != "/") {
			return nil, bad("endpoint %q is not http(s)://HOST[:PORT]", endpoint)
		}
		secure = e.Scheme == "https"
		host = e.Host
	}
	creds := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{},
		&credentials.EnvMinio{},
	})
	tr, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, fmt.Errorf("blob: s3 transport: %w", err)
	}
	c, err := minio.New(host, &minio.Options{
		Creds:        creds,
		Secure:       secure,
		Region:       region,
		Transport:    tr,
		BucketLookup: lookup(endpoint),
	})
	if err != nil {
		return nil, bad("%v", err)
	}
	s := &S3{c: c, bucket: bucket, prefix: prefix, url: redact(u)}
	ok, err := c.BucketExists(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("blob: %s: bucket %s: %w", s.url, bucket, s3Err(err))
	}
	if !ok {
		if err := c.MakeBucket(ctx, bucket, minio.MakeBucketOptions{Region: region}); err != nil {
			if r := minio.ToErrorResponse(err); r.Code != "BucketAlreadyOwnedByYou" && r.Code != "BucketAlreadyExists" {
				return nil, fmt.Errorf("blob: %s: create bucket %s: %w", s.url, bucket, s3Err(err))
			}
		}
	}
	return s, nil
}

func lookup(endpoint string) minio.BucketLookupType {
	if endpoint == "" {
		return minio.BucketLookupAuto
	}
	return minio.BucketLookupPath
}

func redact(u *url.URL) string {
	v := *u
	v.User = nil
	return v.String()
}

func (s *S3) String() string { return s.url }

func (s *S3) name(key string) (string, error) {
	if err := ValidKey(key); err != nil {
		return "", err
	}
	return s.prefix + key, nil
}

// s3Err maps S3's "no such key" to ErrNotFound and keeps the rest.
func s3Err(err error) error {
	if err == nil {
		return nil
	}
	r := minio.ToErrorResponse(err)
	if r.StatusCode == http.StatusNotFound || r.Code == "NoSuchKey" {
		return fmt.Errorf("%s: %w", r.Message, ErrNotFound)
	}
	return err
}

// Put implements Store. An object of more than PartSize bytes read from an
// *os.File goes up in UploadThreads parallel parts; S3 publishes it only
// when the multipart upload completes, and an aborted upload leaves no
// object.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	name, err := s.name(key)
	if err != nil {
		return err
	}
	if size < 0 {
		return model.Errorf(model.ErrInvalid, "blob %s: size %d", key, size)
	}
	var cr *countingReader
	if f, ok := r.(*os.File); ok {
		// Parallel parts from the file (minio-go reads it with ReadAt):
		// its size is checked here, as a stream's is while it is read.
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("blob: put %s: %w", key, err)
		}
		if st.Size() != size {
			return fmt.Errorf("blob: put %s: the file has %d bytes, size given %d", key, st.Size(), size)
		}
	} else {
		// Any other reader is read as a stream (its own ReadAt hidden),
		// counted.
		cr = &countingReader{r: r, limit: size}
		r = cr
	}
	info, err := s.c.PutObject(ctx, s.bucket, name, r, size, minio.PutObjectOptions{
		PartSize:    PartSize,
		NumThreads:  UploadThreads,
		ContentType: "application/octet-stream",
	})
	if err != nil {
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	if info.Size != size || cr != nil && cr.extra {
		// The reader was not size bytes long: the object is wrong (the
		// client sent size bytes of it); take it away again.
		s.c.RemoveObject(context.WithoutCancel(ctx), s.bucket, name, minio.RemoveObjectOptions{})
		return fmt.Errorf("blob: put %s: the reader had more or fewer bytes than the size given (%d)", key, size)
	}
	return nil
}

// Get implements Store.
func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, int64, error) {
	name, err := s.name(key)
	if err != nil {
		return nil, 0, err
	}
	o, err := s.c.GetObject(ctx, s.bucket, name, minio.GetObjectOptions{})
	if err != nil {
		return nil, 0, fmt.Errorf("blob: get %s: %w", key, s3Err(err))
	}
	st, err := o.Stat() // the GET's response: no second request
	if err != nil {
		o.Close()
		return nil, 0, fmt.Errorf("blob: get %s: %w", key, s3Err(err))
	}
	return o, st.Size, nil
}

// Stat implements Store.
func (s *S3) Stat(ctx context.Context, key string) (Object, error) {
	name, err := s.name(key)
	if err != nil {
		return Object{}, err
	}
	st, err := s.c.StatObject(ctx, s.bucket, name, minio.StatObjectOptions{})
	if err != nil {
		return Object{}, fmt.Errorf("blob: stat %s: %w", key, s3Err(err))
	}
	return Object{Key: key, Size: st.Size, Modified: st.LastModified}, nil
}

// Delete implements Store.
func (s *S3) Delete(ctx context.Context, key string) error {
	name, err := s.name(key)
	if err != nil {
		return err
	}
	if err := s.c.RemoveObject(ctx, s.bucket, name, minio.RemoveObjectOptions{}); err != nil && !errors.Is(s3Err(err), ErrNotFound) {
		return fmt.Errorf("blob: delete %s: %w", key, err)
	}
	return nil
}

// List implements Store.
func (s *S3) List(ctx context.Context, prefix string) ([]Object, error) {
	if err := validPrefix(prefix); err != nil {
		return nil, err
	}
	var out []Object
	for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, fmt.Errorf("blob: list %s: %w", prefix, o.Err)
		}
		out = append(out, Object{Key: strings.TrimPrefix(o.Key, s.prefix), Size: o.Size, Modified: o.LastModified})
	}
	slices.SortFunc(out, func(a, b Object) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}
