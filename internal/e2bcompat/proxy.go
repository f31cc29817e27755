package e2bcompat

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// Headers of sandbox traffic.
const (
	HeaderSandboxID   = "E2b-Sandbox-Id"
	HeaderSandboxPort = "E2b-Sandbox-Port"
	headerAccessToken = "X-Access-Token"
	// HeaderDataPlaneToken carries the server-signed envd token from the
	// router to the worker's /e2b route (Authorization is the user's: envd
	// reads the run-as user from it).
	HeaderDataPlaneToken = workerapi.HeaderDataPlaneToken
)

// maxRPCBody caps the body of an envd RPC (file bytes go through /files).
// The body streams to the worker; a longer one is cut and answered 413.
const maxRPCBody = 16 << 20

// MaxInflightPerSandbox is how many requests to one sandbox (envd and its
// ports together, streams and upgraded connections included) the router
// carries at once unless Options.MaxInflightPerSandbox says otherwise; one
// more is answered 429.
const MaxInflightPerSandbox = 64

// maxEnvdGetBody caps an envd answer the server reads itself (metrics).
const maxEnvdGetBody = 1 << 20

// workerTokenTTL is the validity of the token the router signs for one
// forwarded request.
const workerTokenTTL = 10 * time.Minute

// target names the sandbox and port a request is for.
type target struct {
	sandboxID string
	port      int
}

// sandboxTarget recognizes sandbox traffic: the E2b-Sandbox-Id header (port
// from E2b-Sandbox-Port, default 49983), or a Host "<port>-<sandboxID>.<domain>".
func sandboxTarget(r *http.Request) (target, bool, error) {
	if id := strings.TrimSpace(r.Header.Get(HeaderSandboxID)); id != "" {
		port := EnvdPort
		if ps := strings.TrimSpace(r.Header.Get(HeaderSandboxPort)); ps != "" {
			n, err := strconv.Atoi(ps)
			if err != nil || n < 1 || n > 65535 {
				return target{sandboxID: id}, true, fmt.Errorf("%s %q is not a port number", HeaderSandboxPort, ps)
			}
			port = n
		}
		return target{sandboxID: id, port: port}, true, nil
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, _, ok := strings.Cut(host, ".")
	if !ok {
		return target{}, false, nil
	}
	ps, id, ok := strings.Cut(label, "-")
	if !ok || id == "" || ps == "" || strings.Trim(ps, "0123456789") != "" {
		return target{}, false, nil
	}
	n, err := strconv.Atoi(ps)
	if err != nil || n < 1 || n > 65535 {
		return target{}, false, nil
	}
	return target{sandboxID: id, port: n}, true, nil
}

// router dispatches sandbox traffic to the data plane of the sandbox's
// worker; everything else goes to the next handler.
type router struct {
	s *server
	// local returns the in-process data-plane handler of workerID, or nil.
	local func(workerID string) http.Handler

	// maxInflight caps the requests in flight per sandbox (inflight).
	maxInflight int

	mu       sync.Mutex
	proxies  map[string]*httputil.ReverseProxy // by data-plane URL
	inflight map[string]int                    // by sandbox id
}

// acquire counts one more request in flight to sandbox id, or reports
// false when the sandbox has maxInflight already.
func (rt *router) acquire(id string) (release func(), ok bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.inflight[id] >= rt.maxInflight {
		return nil, false
	}
	if rt.inflight == nil {
		rt.inflight = map[string]int{}
	}
	rt.inflight[id]++
	return func() {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		if rt.inflight[id]--; rt.inflight[id] <= 0 {
			delete(rt.inflight, id)
		}
	}, true
}

// sandboxError is the 502 infra answers for a sandbox that is not running
// (the SDK's isRunning() reads it as false).
type sandboxError struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Code      int    `json:"code"`
}

func writeSandboxError(w http.ResponseWriter, id string, status int, msg string) {
	writeJSON(w, status, sandboxError{SandboxID: id, Message: msg, Code: status})
}

func (rt *router) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, ok, err := sandboxTarget(r)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		if err != nil {
			writeSandboxError(w, t.sandboxID, http.StatusBadRequest, err.Error())
			return
		}
		rt.serve(w, r, t)
	})
}

// wakeForTraffic wakes sb (created with autoResume) for the request and
// waits, at most the adapter's create wait, until it runs on a worker.
func (rt *router) wakeForTraffic(ctx context.Context, sb model.Sandbox) (model.Sandbox, error) {
	if err := rt.s.svc.WakeForTraffic(ctx, sb, "sandbox traffic"); err != nil {
		return sb, err
	}
	ctx, cancel := context.WithTimeout(ctx, rt.s.createWait)
	defer cancel()
	delay := 50 * time.Millisecond
	for {
		cur, err := rt.s.svc.Route(ctx, sb.ID)
		if err != nil {
			return sb, err
		}
		switch {
		case cur.State == model.StateRunning && cur.WorkerID != "":
			return cur, nil
		case e2bState(cur) == "" || cur.State == model.StatePaused && cur.DesiredState == model.StatePaused:
			// gone, failed, or paused again by someone else
			return cur, fmt.Errorf("the sandbox is %s; resume it with Sandbox.connect", cur.State)
		}
		select {
		case <-ctx.Done():
			return cur, fmt.Errorf("the sandbox did not wake within %s; retry or resume it with Sandbox.connect", rt.s.createWait)
		case <-time.After(delay):
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

func (rt *router) serve(w http.ResponseWriter, r *http.Request, t target) {
	ctx := r.Context()
	sb, err := rt.s.svc.Route(ctx, t.sandboxID)
	if errors.Is(err, model.ErrNotFound) || err == nil && e2bState(sb) == "" {
		writeSandboxError(w, t.sandboxID, http.StatusBadGateway, "The sandbox was not found")
		return
	}
	if err != nil {
		rt.s.log.Error("e2b sandbox traffic: look up sandbox", "sandbox", t.sandboxID, "err", err)
		writeSandboxError(w, t.sandboxID, http.StatusBadGateway, "sandbox lookup failed; retry")
		return
	}
	if t.port == EnvdPort {
		if err := rt.authorizeEnvd(ctx, r, sb); err != nil {
			writeSandboxError(w, t.sandboxID, http.StatusUnauthorized, err.Error())
			return
		}
	} else if err := rt.s.svc.CheckTraffic(ctx, sb, r.Header.Get(service.TrafficTokenHeader)); err != nil {
		status := http.StatusUnauthorized
		if errors.Is(err, model.ErrForbidden) {
			status = http.StatusForbidden
		} else if !errors.Is(err, model.ErrUnauthorized) {
			rt.s.log.Error("e2b sandbox traffic: traffic token", "sandbox", sb.ID, "err", err)
			status, err = http.StatusBadGateway, errors.New("signing key unavailable")
		}
		writeSandboxError(w, t.sandboxID, status, message(err))
		return
	}
	release, ok := rt.acquire(sb.ID)
	if !ok {
		w.Header().Set("Retry-After", "1")
		writeSandboxError(w, t.sandboxID, http.StatusTooManyRequests, fmt.Sprintf("sandbox %s has %d requests in flight, the most the server carries at once; retry when one has finished", sb.ID, rt.maxInflight))
		return
	}
	defer release()
	if sb.State != model.StateRunning && !sb.NoAutoWake && (e2bState(sb) == "paused" || sb.State == model.StateWaking) {
		// autoResume: the traffic wakes the sandbox and waits for it.
		if sb, err = rt.wakeForTraffic(ctx, sb); err != nil {
			writeSandboxError(w, t.sandboxID, http.StatusBadGateway, message(err))
			return
		}
	}
	if sb.State != model.StateRunning {
		writeSandboxError(w, t.sandboxID, http.StatusBadGateway, fmt.Sprintf("The sandbox is %s; resume it with Sandbox.connect", e2bState(sb)))
		return
	}
	h, base, err := rt.worker(ctx, sb)
	if err != nil {
		writeSandboxError(w, t.sandboxID, http.StatusBadGateway, err.Error())
		return
	}
	// Signed with the current data-plane key, derived for the sandbox's
	// worker (the adapter's own key signs only envd access tokens).
	tok, err := rt.s.svc.SignWorkerToken(ctx, token.Claims{SandboxID: sb.ID, OrgID: sb.OrgID, Scope: token.ScopeEnvd, Expires: time.Now().Add(workerTokenTTL).Unix(), Worker: sb.WorkerID})
	if err != nil {
		rt.s.log.Error("e2b sandbox traffic: sign the worker token", "err", err)
		writeSandboxError(w, t.sandboxID, http.StatusBadGateway, "signing key unavailable")
		return
	}
	out := r.Clone(ctx)
	// Bodies stream both ways. A server stream answers while a chunked
	// body may still be arriving (its last chunk); an HTTP/1.1 server
	// that is not full duplex would drain or drop the rest of the body
	// once the answer starts, cutting the forwarded request.
	_ = http.NewResponseController(w).EnableFullDuplex()
	if t.port == EnvdPort && r.URL.Path != "/files" && r.Body != nil && r.Body != http.NoBody {
		// An RPC (file bytes go through /files): bounded.
		if r.ContentLength > maxRPCBody {
			writeSandboxError(w, t.sandboxID, http.StatusRequestEntityTooLarge, rpcTooLarge)
			return
		}
		out.Body = http.MaxBytesReader(w, r.Body, maxRPCBody)
	}
	stripCredentials(out.Header, t.port == EnvdPort)
	out.URL.Path = workerapi.E2BPath(sb.ID, t.port) + r.URL.Path
	out.URL.RawPath = ""
	if r.URL.RawPath != "" {
		out.URL.RawPath = workerapi.E2BPath(sb.ID, t.port) + r.URL.RawPath
	}
	out.Header.Set(HeaderDataPlaneToken, tok)
	if h != nil {
		out.RequestURI = out.URL.RequestURI()
		h.ServeHTTP(w, out)
		return
	}
	rt.proxy(base).ServeHTTP(w, out)
}

// authorizeEnvd applies envd's rule: every request needs X-Access-Token
// except GET /health, and /files, which also accepts a URL signature.
func (rt *router) authorizeEnvd(ctx context.Context, r *http.Request, sb model.Sandbox) error {
	if r.URL.Path == "/health" {
		return nil
	}
	want, err := rt.s.envdToken(ctx, sb)
	if err != nil {
		return err
	}
	if got := r.Header.Get(headerAccessToken); got != "" {
		if subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 {
			return nil
		}
		return errors.New("invalid access token")
	}
	if r.URL.Path == "/files" {
		return checkSignature(r, want, time.Now())
	}
	return errors.New("missing access token (X-Access-Token)")
}

// checkSignature verifies an E2B file-URL signature: "v1_" + unpadded
// base64 of sha256("<path>:<read|write>:<username>:<token>[:<expiry>]").
func checkSignature(r *http.Request, envdToken string, now time.Time) error {
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return errors.New("missing access token (X-Access-Token) or URL signature")
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + envdToken
	if exp := q.Get("signature_expiration"); exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return errors.New("signature_expiration is not a number")
		}
		if now.Unix() > n {
			return errors.New("the URL signature has expired")
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) != 1 {
		return errors.New("invalid URL signature")
	}
	return nil
}

// worker returns the in-process handler of the sandbox's worker, or the
// base URL of its data plane.
func (rt *router) worker(ctx context.Context, sb model.Sandbox) (http.Handler, string, error) {
	if sb.WorkerID == "" {
		return nil, "", errors.New("the sandbox has no worker yet; retry")
	}
	if rt.local != nil {
		if h := rt.local(sb.WorkerID); h != nil {
			return h, "", nil
		}
	}
	base, err := rt.s.svc.DataPlaneURL(ctx, sb.WorkerID)
	if err != nil {
		return nil, "", fmt.Errorf("worker %s of the sandbox is unknown: %v", sb.WorkerID, err)
	}
	if base == "" {
		return nil, "", fmt.Errorf("worker %s has no data-plane URL", sb.WorkerID)
	}
	return nil, base, nil
}

func (rt *router) proxy(base string) *httputil.ReverseProxy {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if p := rt.proxies[base]; p != nil {
		return p
	}
	u, err := url.Parse(base)
	if err != nil {
		u = &url.URL{Scheme: "http", Host: "invalid"}
	}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = u.Host
		},
		FlushInterval: -1, // stream every write (Connect server streams)
		ErrorLog:      slog.NewLogLogger(rt.s.log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return
			}
			if big := (*http.MaxBytesError)(nil); errors.As(err, &big) {
				writeSandboxError(w, r.Header.Get(HeaderSandboxID), http.StatusRequestEntityTooLarge, rpcTooLarge)
				return
			}
			writeSandboxError(w, r.Header.Get(HeaderSandboxID), http.StatusBadGateway, "worker data plane unreachable: "+err.Error())
		},
	}
	if rt.proxies == nil {
		rt.proxies = map[string]*httputil.ReverseProxy{}
	}
	rt.proxies[base] = p
	return p
}

// rpcTooLarge answers an envd RPC body over maxRPCBody.
var rpcTooLarge = fmt.Sprintf("an envd RPC body may be at most %d bytes (send file bytes to /files)", maxRPCBody)

// stripCredentials removes from h what a client sent to authenticate to
// Airlock or to the router, before the request goes to the worker and into
// the guest (which is untrusted): API keys, envd access and traffic tokens,
// X-Airlock-* headers. Authorization goes too, except on envd's port,
// where envd reads the run-as user from "Basic base64(user:)" (that user is
// all that is kept).
func stripCredentials(h http.Header, envd bool) {
	basic := h.Get("Authorization")
	for k := range h {
		switch ck := http.CanonicalHeaderKey(k); {
		case ck == "Authorization", ck == "X-Api-Key", ck == headerAccessToken,
			ck == http.CanonicalHeaderKey(service.TrafficTokenHeader), strings.HasPrefix(ck, "X-Airlock-"):
			delete(h, k)
		}
	}
	if user, ok := basicUser(basic); envd && ok {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
}

// basicUser returns the user name of a Basic Authorization value.
func basicUser(v string) (string, bool) {
	scheme, enc, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", false
	}
	user, _, _ := strings.Cut(string(b), ":")
	return user, user != ""
}

// boundedWriter is an http.ResponseWriter that keeps at most limit body
// bytes: a write beyond that fails, which ends the forwarding (the router
// never holds more of an answer it reads itself than limit).
type boundedWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
	limit  int
	over   bool
}

func (b *boundedWriter) Header() http.Header { return b.header }

func (b *boundedWriter) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *boundedWriter) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	if room := b.limit - b.body.Len(); len(p) > room {
		b.body.Write(p[:max(room, 0)])
		b.over = true
		return max(room, 0), errAnswerTooLarge
	}
	return b.body.Write(p)
}

func (b *boundedWriter) Flush() {}

var errAnswerTooLarge = errors.New("answer too large")

// envdGet fetches an envd path of a running sandbox through its worker
// (used for metrics); an answer longer than maxEnvdGetBody is an error.
func (rt *router) envdGet(ctx context.Context, sb model.Sandbox, path string) (body []byte, err error) {
	tok, err := rt.s.envdToken(ctx, sb)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://airlock"+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(HeaderSandboxID, sb.ID)
	req.Header.Set(headerAccessToken, tok)
	req.RequestURI = path
	bw := &boundedWriter{header: http.Header{}, limit: maxEnvdGetBody}
	func() {
		// A reverse proxy whose copy fails (our write, above) aborts its
		// handler with http.ErrAbortHandler; here the handler is ours.
		defer func() {
			if p := recover(); p != nil && p != http.ErrAbortHandler {
				panic(p)
			}
		}()
		rt.serve(bw, req, target{sandboxID: sb.ID, port: EnvdPort})
	}()
	if bw.over {
		return nil, fmt.Errorf("envd %s answered more than %d bytes", path, maxEnvdGetBody)
	}
	if bw.status != http.StatusOK {
		msg := bw.body.Bytes()[:min(bw.body.Len(), 4096)]
		return nil, fmt.Errorf("envd %s answered %d: %s", path, bw.status, strings.TrimSpace(string(msg)))
	}
	return bw.body.Bytes(), nil
}
