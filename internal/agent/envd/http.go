package envd

import (
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleEnvs(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.env())
}

// InitRequest is the body of POST /init. The sandbox's host sends it once
// the sandbox runs (and again after a restore).
type InitRequest struct {
	EnvVars        map[string]string `json:"envVars,omitempty"`
	AccessToken    *string           `json:"accessToken,omitempty"`
	DefaultUser    string            `json:"defaultUser,omitempty"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
	Timestamp      *time.Time        `json:"timestamp,omitempty"`
}

// handleInit stores the sandbox environment, access token and defaults.
// Once a token is set, changing it needs the current one.
func (s *Server) handleInit(w http.ResponseWriter, r *http.Request) {
	var req InitRequest
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
			writeHTTPError(w, http.StatusBadRequest, fmt.Sprintf("decode init body: %v", err))
			return
		}
	}
	if req.DefaultUser != "" {
		if _, ok := s.agent.LookupUser(req.DefaultUser); !ok {
			writeHTTPError(w, http.StatusBadRequest, fmt.Sprintf("default user %q does not exist", req.DefaultUser))
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.accessToken != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(s.accessToken)) != 1 {
		writeHTTPError(w, http.StatusUnauthorized, "an access token is set: send it as X-Access-Token to init again")
		return
	}
	if req.EnvVars != nil {
		s.envVars = req.EnvVars
	}
	if req.AccessToken != nil {
		s.accessToken = *req.AccessToken
	}
	if req.DefaultUser != "" {
		s.defaultUser = req.DefaultUser
	}
	if req.DefaultWorkdir != "" {
		s.defaultWorkdir = req.DefaultWorkdir
	}
	w.WriteHeader(http.StatusNoContent)
}

// Metrics is the body of GET /metrics.
type Metrics struct {
	Timestamp   int64   `json:"ts"`
	CPUCount    int     `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotal    uint64  `json:"mem_total"`
	MemUsed     uint64  `json:"mem_used"`
	MemCache    uint64  `json:"mem_cache"`
	MemTotalMiB uint64  `json:"mem_total_mib"`
	MemUsedMiB  uint64  `json:"mem_used_mib"`
	DiskUsed    uint64  `json:"disk_used"`
	DiskTotal   uint64  `json:"disk_total"`
}

type cpuSample struct{ busy, total uint64 }

// readCPU reads the aggregate line of /proc/stat.
func readCPU() (cpuSample, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuSample{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[0] != "cpu" {
			continue
		}
		var c cpuSample
		for i, v := range fields[1:] {
			n, _ := strconv.ParseUint(v, 10, 64)
			c.total += n
			if i != 3 && i != 4 { // idle, iowait
				c.busy += n
			}
		}
		return c, nil
	}
	return cpuSample{}, errors.New("no cpu line in /proc/stat")
}

// cpuPercent is the CPU use since the previous call (the first call
// samples over 100 ms).
func (s *Server) cpuPercent() float64 {
	s.cpuMu.Lock()
	defer s.cpuMu.Unlock()
	prev := s.cpuLast
	if prev.total == 0 {
		var err error
		if prev, err = readCPU(); err != nil {
			return 0
		}
		time.Sleep(100 * time.Millisecond)
	}
	cur, err := readCPU()
	if err != nil {
		return 0
	}
	s.cpuLast = cur
	if cur.total <= prev.total {
		return 0
	}
	pct := 100 * float64(cur.busy-prev.busy) / float64(cur.total-prev.total)
	return float64(int64(pct*100)) / 100
}

func readMeminfo() (total, available, cached uint64, err error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		n, _ := strconv.ParseUint(fields[1], 10, 64)
		n *= 1024
		switch fields[0] {
		case "MemTotal:":
			total = n
		case "MemAvailable:":
			available = n
		case "Cached:":
			cached = n
		}
	}
	return total, available, cached, sc.Err()
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	m := Metrics{Timestamp: time.Now().Unix(), CPUCount: runtime.NumCPU(), CPUUsedPct: s.cpuPercent()}
	total, avail, cached, err := readMeminfo()
	if err != nil {
		writeHTTPError(w, http.StatusInternalServerError, fmt.Sprintf("read /proc/meminfo: %v", err))
		return
	}
	m.MemTotal, m.MemCache = total, cached
	if avail <= total {
		m.MemUsed = total - avail
	}
	m.MemTotalMiB, m.MemUsedMiB = m.MemTotal>>20, m.MemUsed>>20
	var st syscall.Statfs_t
	if err := syscall.Statfs("/", &st); err == nil {
		m.DiskTotal = st.Blocks * uint64(st.Bsize)
		m.DiskUsed = (st.Blocks - st.Bfree) * uint64(st.Bsize)
	}
	writeJSON(w, http.StatusOK, m)
}

// Signature returns the file URL signature envd accepts instead of an
// access token: v1_ + unpadded base64 of SHA-256 over
// "path:operation:username:token[:expiration]".
func Signature(path, operation, username, token string, expiration int64) string {
	msg := path + ":" + operation + ":" + username + ":" + token
	if expiration != 0 {
		msg += ":" + strconv.FormatInt(expiration, 10)
	}
	sum := sha256.Sum256([]byte(msg))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// filesAuthorized checks X-Access-Token or the signature query.
func (s *Server) filesAuthorized(r *http.Request, operation string) error {
	tok := s.token()
	if tok == "" || s.tokenOK(r) {
		return nil
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return errors.New("missing X-Access-Token or signature")
	}
	var exp int64
	if e := q.Get("signature_expiration"); e != "" {
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			return fmt.Errorf("signature_expiration %q is not a unix time", e)
		}
		if time.Now().Unix() > n {
			return errors.New("the signature has expired")
		}
		exp = n
	}
	want := Signature(q.Get("path"), operation, q.Get("username"), tok, exp)
	if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) != 1 {
		return errors.New("invalid signature")
	}
	return nil
}

func (s *Server) handleReadFile(w http.ResponseWriter, r *http.Request) {
	if err := s.filesAuthorized(r, "read"); err != nil {
		writeHTTPError(w, http.StatusUnauthorized, err.Error())
		return
	}
	q := r.URL.Query()
	u, err := s.user(r.Header, q.Get("username"))
	if err != nil {
		writeHTTPError(w, http.StatusUnauthorized, err.Error())
		return
	}
	path, err := s.resolve(q.Get("path"), u)
	if err != nil {
		writeHTTPError(w, http.StatusBadRequest, err.Error())
		return
	}
	f, err := os.Open(path)
	if err != nil {
		writeHTTPError(w, httpStatus(err), fmt.Sprintf("open %s: %v", path, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeHTTPError(w, httpStatus(err), fmt.Sprintf("stat %s: %v", path, err))
		return
	}
	if fi.IsDir() {
		writeHTTPError(w, http.StatusBadRequest, fmt.Sprintf("%s is a directory", path))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": filepath.Base(path)}))
	var out io.Writer = w
	if acceptsGzip(r) {
		h.Set("Content-Encoding", "gzip")
		h.Add("Vary", "Accept-Encoding")
		w.WriteHeader(http.StatusOK)
		zw := gzip.NewWriter(w)
		defer zw.Close()
		out = zw
	} else {
		h.Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		w.WriteHeader(http.StatusOK)
	}
	_, _ = io.CopyBuffer(struct{ io.Writer }{out}, struct{ io.Reader }{f}, make([]byte, 1<<20))
}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") && !strings.Contains(strings.ReplaceAll(params, " ", ""), "q=0") {
			return true
		}
	}
	return false
}

// WriteInfo is one element of the POST /files answer.
type WriteInfo struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// metadataHeader prefixes the request headers whose values become file
// metadata (extended attributes under xattrPrefix).
const metadataHeader = "X-Metadata-"

// requestMetadata collects X-Metadata-<key> headers; keys are lower case
// (HTTP header names are case-insensitive).
func requestMetadata(h http.Header) map[string]string {
	var md map[string]string
	for k, v := range h {
		if len(k) > len(metadataHeader) && strings.EqualFold(k[:len(metadataHeader)], metadataHeader) && len(v) > 0 {
			if md == nil {
				md = map[string]string{}
			}
			md[strings.ToLower(k[len(metadataHeader):])] = v[0]
		}
	}
	return md
}

func (s *Server) handleWriteFiles(w http.ResponseWriter, r *http.Request) {
	if err := s.filesAuthorized(r, "write"); err != nil {
		writeHTTPError(w, http.StatusUnauthorized, err.Error())
		return
	}
	q := r.URL.Query()
	u, err := s.user(r.Header, q.Get("username"))
	if err != nil {
		writeHTTPError(w, http.StatusUnauthorized, err.Error())
		return
	}
	md := requestMetadata(r.Header)
	var written []WriteInfo
	write := func(raw string, body io.Reader) error {
		path, err := s.resolve(raw, u)
		if err != nil {
			return err
		}
		if err := s.agent.WriteFile(path, body, u.Name); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		if err := setMetadata(path, md); err != nil {
			return err
		}
		written = append(written, WriteInfo{Path: path, Name: filepath.Base(path), Type: "file", Metadata: md})
		return nil
	}
	fail := func(err error) {
		writeHTTPError(w, httpStatus(err), err.Error())
	}
	mediaType, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mediaType == "multipart/form-data" {
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			part, err := mr.NextRawPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeHTTPError(w, http.StatusBadRequest, fmt.Sprintf("read multipart body: %v", err))
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			target := q.Get("path")
			if target == "" {
				// The filename carries the full path: read it raw, as
				// Part.FileName keeps only the base name.
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				target = dp["filename"]
			}
			var body io.Reader = part
			if strings.EqualFold(part.Header.Get("Content-Transfer-Encoding"), "base64") {
				body = base64.NewDecoder(base64.StdEncoding, part)
			}
			err = write(target, body)
			part.Close()
			if err != nil {
				fail(err)
				return
			}
		}
	} else {
		var body io.Reader = r.Body
		if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				writeHTTPError(w, http.StatusBadRequest, fmt.Sprintf("read gzip body: %v", err))
				return
			}
			defer zr.Close()
			body = zr
		}
		if q.Get("path") == "" {
			writeHTTPError(w, http.StatusBadRequest, "the path query parameter is required for a raw body")
			return
		}
		if err := write(q.Get("path"), body); err != nil {
			fail(err)
			return
		}
	}
	if len(written) == 0 {
		writeHTTPError(w, http.StatusBadRequest, `no file in the request: send multipart parts named "file" or a raw body with ?path=`)
		return
	}
	writeJSON(w, http.StatusOK, written)
}
