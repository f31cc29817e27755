package worker

// E2B sandbox traffic on the data plane. The server's router (package
// e2bcompat) recognizes E2B envd and sandbox-port requests and hands them
// here, in-process or by reverse proxy, as
//
//	ANY /e2b/{sid}/{port}/{path...}   header X-Airlock-Dataplane-Token: <token of scope envd for sid>
//
// Port 49983 (envd) goes to the agent's envd at /envd/{path}; any other port
// to the agent's /ports/{port}/{path}, which proxies to that port inside the
// sandbox. Bodies stream both ways, flushed per write, so Connect server
// streams over HTTP/1.1 deliver each message as it comes. Before the first
// envd request to a sandbox the worker calls the agent's /envd/init with
// the sandbox's environment and E2B's default user and working directory.
// A sandbox that is not running here answers 502 {"sandboxId","message","code"}.
//
// The route needs a server-signed token of scope envd for the sandbox: the
// router signs one per request after its own checks (envd's access token on
// port 49983, the sandbox's traffic token on the others), and the only such
// token a client ever holds is E2B's envdAccessToken, which controls the
// whole sandbox anyway. Before anything goes into the guest the worker
// removes what authenticated the client (stripCredentials).

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock/airlock/internal/agentclient"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// Constants of the E2B route.
const (
	e2bEnvdPort = 49983
	// e2bTokenHeader carries the server-signed token (Authorization is left
	// to the caller: envd reads the run-as user from it).
	e2bTokenHeader     = workerapi.HeaderDataPlaneToken
	e2bDefaultUser     = "user"
	e2bDefaultWorkdir  = "/home/user"
	e2bInitTimeout     = 10 * time.Second
	e2bSandboxNotFound = "The sandbox was not found"
)

// envdInits remembers which agent clients got /envd/init, per sandbox.
type envdInits struct {
	mu   sync.Mutex
	done map[string]envdInit
}

// envdInit is what /envd/init last delivered to a sandbox: for which agent
// connection and with which env (a warm-pool claim changes the env).
type envdInit struct {
	ac  *agentclient.Client
	env string
}

var e2bInits = &envdInits{done: map[string]envdInit{}}

// envKey is a stable fingerprint of env.
func envKey(env map[string]string) string {
	keys := slices.Sorted(maps.Keys(env))
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%q=%q;", k, env[k])
	}
	return b.String()
}

// registerE2B adds the E2B route to the data-plane mux.
func (w *Worker) registerE2B(mux *http.ServeMux) {
	mux.HandleFunc(workerapi.RouteE2B, w.handleE2B)
}

func writeE2BError(rw http.ResponseWriter, sid string, status int, msg string) {
	writeJSON(rw, status, map[string]any{"sandboxId": sid, "message": msg, "code": status})
}

func (w *Worker) handleE2B(rw http.ResponseWriter, r *http.Request) {
	sid := r.PathValue("sid")
	kp := w.key.Load()
	if kp == nil {
		writeE2BError(rw, sid, http.StatusServiceUnavailable, "worker is not registered with a server yet")
		return
	}
	c, err := token.Verify(*kp, r.Header.Get(e2bTokenHeader), time.Now())
	if err != nil || c.SandboxID != sid || c.Scope != token.ScopeEnvd {
		writeE2BError(rw, sid, http.StatusUnauthorized, "missing or invalid data-plane token for this sandbox")
		return
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		writeE2BError(rw, sid, http.StatusBadRequest, "port must be a number between 1 and 65535")
		return
	}
	path := "/" + r.PathValue("path")
	// The mux cleans literal dot segments; encoded ones ("..%2F", "%2e%2e")
	// arrive decoded in the path value and would reach the agent, whose own
	// routing must not be what keeps a port request out of envd.
	for _, seg := range strings.Split(path, "/") {
		if seg == "." || seg == ".." {
			writeE2BError(rw, sid, http.StatusBadRequest, "the path may not contain . or .. segments (encoded or not)")
			return
		}
	}
	if port == e2bEnvdPort && path == "/init" {
		writeE2BError(rw, sid, http.StatusNotFound, "/init is internal to Airlock")
		return
	}
	ac, env, err := w.agentFor(sid)
	if err != nil {
		writeE2BError(rw, sid, http.StatusBadGateway, e2bSandboxNotFound+": "+err.Error())
		return
	}
	// E2B traffic is activity (idle auto-suspend), also when a stream ends.
	w.touch(sid)
	defer w.touch(sid)
	// Bodies stream both ways: an HTTP/1.1 server that is not full duplex
	// drains or drops the rest of a request body once the answer starts.
	_ = http.NewResponseController(rw).EnableFullDuplex()
	if port == e2bEnvdPort {
		if err := e2bInits.ensure(r.Context(), sid, ac, w.withCAEnv(sid, env), w.sandboxTemplateConfig(sid)); err != nil {
			w.log.Warn("envd init", "sandbox", sid, "err", err)
			writeE2BError(rw, sid, http.StatusBadGateway, "envd in the sandbox did not initialize: "+err.Error())
			return
		}
		path = "/envd" + path
	} else {
		if isUpgrade(r) {
			w.tunnelUpgrade(rw, r, ac, sid, port, path)
			return
		}
		path = "/ports/" + strconv.Itoa(port) + path
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Path = path
			pr.Out.URL.RawPath = ""
			stripCredentials(pr.Out.Header, port == e2bEnvdPort)
		},
		Transport:     roundTripper(ac.Do),
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(w.log.Handler(), slog.LevelDebug),
		ErrorHandler: func(rw http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return
			}
			if big := (*http.MaxBytesError)(nil); errors.As(err, &big) {
				// The server's router bounds envd RPC bodies (in process).
				writeE2BError(rw, sid, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is larger than %d bytes", big.Limit))
				return
			}
			w.log.Debug("e2b forward", "sandbox", sid, "path", path, "err", err)
			writeE2BError(rw, sid, http.StatusBadGateway, "the sandbox did not answer: "+err.Error())
		},
	}
	proxy.ServeHTTP(rw, r)
}

// stripCredentials removes from h what a client sent to authenticate to
// Airlock, before the request goes into the (untrusted) guest: API keys
// (X-API-KEY, Authorization), envd access and traffic tokens and every
// X-Airlock-* header (the data-plane token among them). On envd's port
// Authorization "Basic base64(user:)" names envd's run-as user: only that
// user is kept.
func stripCredentials(h http.Header, envd bool) {
	user, basic := basicUser(h.Get("Authorization"))
	for k := range h {
		switch ck := http.CanonicalHeaderKey(k); {
		case ck == "Authorization", ck == "X-Api-Key", ck == "X-Access-Token",
			ck == "E2b-Traffic-Access-Token", strings.HasPrefix(ck, "X-Airlock-"):
			delete(h, k)
		}
	}
	if envd && basic {
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

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// ensure calls the agent's /envd/init once per agent client of sid. An
// agent without envd (404) is remembered as done too: its requests then
// fail on their own. An imported template's config (tmpl) gives the
// default user, working directory and env under the sandbox's.
func (e *envdInits) ensure(ctx context.Context, sid string, ac *agentclient.Client, env map[string]string, tmpl *model.TemplateConfig) error {
	user, workdir := e2bDefaultUser, e2bDefaultWorkdir
	if tmpl != nil {
		user, workdir, env = tmpl.CommandUser(), tmpl.WorkingDir, templateEnv(tmpl, env)
	}
	want := envdInit{ac: ac, env: envKey(env)}
	e.mu.Lock()
	done := e.done[sid] == want
	e.mu.Unlock()
	if done {
		return nil
	}
	if env == nil {
		env = map[string]string{}
	}
	ctx, cancel := context.WithTimeout(ctx, e2bInitTimeout)
	defer cancel()
	// E2B's default user; a template without it keeps the agent's default.
	body := map[string]any{"envVars": env, "defaultUser": user}
	if workdir != "" {
		body["defaultWorkdir"] = workdir
	}
	err := postInit(ctx, ac, body)
	if errors.Is(err, errInitRejected) {
		err = postInit(ctx, ac, map[string]any{"envVars": env})
	}
	if err != nil {
		return err
	}
	e.mu.Lock()
	if len(e.done) > 4096 {
		clear(e.done)
	}
	e.done[sid] = want
	e.mu.Unlock()
	return nil
}

// errInitRejected marks a 4xx answer to /envd/init.
var errInitRejected = errors.New("init rejected")

func postInit(ctx context.Context, ac *agentclient.Client, body map[string]any) error {
	body["timestamp"] = time.Now().UTC().Format(time.RFC3339Nano)
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode init: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://agent/envd/init", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ac.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 || resp.StatusCode == http.StatusNotFound {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	err = fmt.Errorf("agent answered %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	if resp.StatusCode/100 == 4 {
		return fmt.Errorf("%w: %w", errInitRejected, err)
	}
	return err
}

// isUpgrade reports a protocol upgrade (WebSocket and the like).
func isUpgrade(r *http.Request) bool {
	if r.Header.Get("Upgrade") == "" {
		return false
	}
	for _, v := range r.Header["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

// tunnelUpgrade carries an upgrade request to a port inside the sandbox
// through a CONNECT tunnel to the agent (the agent channel is HTTP/2, which
// has no Upgrade): it replays the request in the tunnel, then copies bytes
// both ways until either side closes.
func (w *Worker) tunnelUpgrade(rw http.ResponseWriter, r *http.Request, ac *agentclient.Client, sid string, port int, path string) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	authority := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	creq, err := http.NewRequestWithContext(ctx, http.MethodConnect, "http://"+authority, pr)
	if err != nil {
		writeE2BError(rw, sid, http.StatusBadGateway, err.Error())
		return
	}
	creq.Host = authority
	resp, err := ac.Do(creq)
	if err != nil {
		writeE2BError(rw, sid, http.StatusBadGateway, "the sandbox did not answer: "+err.Error())
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		writeE2BError(rw, sid, http.StatusBadGateway, fmt.Sprintf("port %d in the sandbox: %s", port, strings.TrimSpace(string(b))))
		return
	}
	conn, brw, err := http.NewResponseController(rw).Hijack()
	if err != nil {
		writeE2BError(rw, sid, http.StatusInternalServerError, "cannot take over the connection for an upgrade: "+err.Error())
		return
	}
	defer conn.Close()
	out := r.Clone(ctx)
	out.URL.Path, out.URL.RawPath = path, ""
	stripCredentials(out.Header, false)
	out.Body, out.ContentLength = http.NoBody, 0 // an upgrade request has none
	go func() {
		// The request (its body, if any, is read from the client connection's
		// buffer), then whatever the client sends.
		err := out.Write(pw)
		if err == nil {
			_, err = io.Copy(pw, brw)
		}
		pw.CloseWithError(err)
		cancel()
	}()
	if _, err := io.Copy(conn, resp.Body); err != nil {
		w.log.Debug("upgrade tunnel", "sandbox", sid, "port", port, "err", err)
	}
}
