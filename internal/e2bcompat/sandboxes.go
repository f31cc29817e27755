package e2bcompat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/netpolicy"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/token"
)

// envdTokenTTL is how long an envd access token is valid. The token is
// derived from the sandbox record, so create and connect hand out the same
// one; the router stops honouring it once the sandbox is gone.
const envdTokenTTL = 365 * 24 * time.Hour

// noExpiry is endAt for a sandbox without an expiry (native sandboxes
// created without timeout_s).
const noExpiry = "9999-12-31T23:59:59Z"

// newSandbox is the body of POST /sandboxes (v1, NewSandbox) and
// POST /v2/sandboxes (NewSandboxV2): the fields Airlock reads.
type newSandbox struct {
	TemplateID          string                  `json:"templateID"`
	Timeout             *int                    `json:"timeout"`
	Metadata            map[string]string       `json:"metadata"`
	EnvVars             map[string]string       `json:"envVars"`
	AutoPause           bool                    `json:"autoPause"`
	AutoResume          *struct{ Enabled bool } `json:"autoResume"`
	AllowInternetAccess *bool                   `json:"allow_internet_access"`
	Network             json.RawMessage         `json:"network"`
	MCP                 json.RawMessage         `json:"mcp"`
	VolumeMounts        json.RawMessage         `json:"volumeMounts"`
	IAM                 json.RawMessage         `json:"iam"`
}

// sandboxJSON is E2B's Sandbox (create and connect answers).
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// listedSandbox is E2B's ListedSandbox.
type listedSandbox struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	StartedAt   string            `json:"startedAt"`
	EndAt       string            `json:"endAt"`
	EnvdVersion string            `json:"envdVersion"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	State       string            `json:"state"`
	Metadata    map[string]string `json:"metadata"`
}

type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// sandboxDetail is E2B's SandboxDetail.
type sandboxDetail struct {
	listedSandbox
	EnvdAccessToken     string        `json:"envdAccessToken,omitempty"`
	TrafficAccessToken  *string       `json:"trafficAccessToken"`
	Domain              *string       `json:"domain"`
	AllowInternetAccess bool          `json:"allowInternetAccess"`
	Network             networkJSON   `json:"network"`
	Lifecycle           lifecycleJSON `json:"lifecycle"`
}

// networkJSON is E2B's SandboxNetworkConfig (Airlock has no header
// transforms, egressProxy or maskRequestHost).
type networkJSON struct {
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
}

// sandboxMetric is E2B's SandboxMetric.
type sandboxMetric struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int     `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	MemCache      int64   `json:"memCache"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

// e2bState maps an Airlock state to E2B's running|paused, or "" for a
// sandbox E2B would not show (gone, going, failed).
func e2bState(sb model.Sandbox) string {
	if sb.DesiredState == model.StateDeleted {
		return ""
	}
	switch sb.State {
	case model.StatePending, model.StateStarting, model.StateRunning, model.StateWaking:
		return "running"
	case model.StatePaused, model.StateSuspending, model.StateSuspended:
		return "paused"
	}
	return ""
}

// airlockStates maps an E2B state filter value to Airlock states.
func airlockStates(e2b string) ([]model.SandboxState, error) {
	switch e2b {
	case "running":
		return []model.SandboxState{model.StatePending, model.StateStarting, model.StateRunning, model.StateWaking}, nil
	case "paused":
		return []model.SandboxState{model.StatePaused, model.StateSuspending, model.StateSuspended}, nil
	}
	return nil, badRequest("state %q is not one of running, paused", e2b)
}

// shippedAliases are the E2B names of Airlock's shipped templates
// (templates/): the code-interpreter SDKs create "code-interpreter-v1".
var shippedAliases = map[string]string{"code-interpreter-v1": "code-interpreter"}

// templateRef turns an E2B templateID or alias into an Airlock template
// reference: "base" stays "base"; "team/alias" becomes "alias";
// "code-interpreter-v1" is the shipped code-interpreter.
func templateRef(id string) string {
	if id == "" {
		return service.DefaultTemplate
	}
	if i := strings.LastIndex(id, "/"); i >= 0 {
		id = id[i+1:]
	}
	if a, ok := shippedAliases[id]; ok {
		return a
	}
	return id
}

func publicMetadata(md map[string]string) map[string]string {
	out := make(map[string]string, len(md))
	for k, v := range md {
		if !strings.HasPrefix(k, metaPrefix) {
			out[k] = v
		}
	}
	return out
}

func alias(sb model.Sandbox) string {
	if a := sb.Metadata[metaAlias]; a != "" {
		return a
	}
	return sb.Template
}

// envdToken is the sandbox's envd access token: a data-plane token of
// scope envd, derived from the sandbox record so it is the same on every
// call.
func (s *server) envdToken(ctx context.Context, sb model.Sandbox) (string, error) {
	key, err := s.key(ctx)
	if err != nil {
		return "", fmt.Errorf("load signing key: %w", err)
	}
	tok, err := token.Sign(key, token.Claims{
		SandboxID: sb.ID, OrgID: sb.OrgID, Scope: token.ScopeEnvd,
		Expires: sb.CreatedAt.Add(envdTokenTTL).Unix(),
	})
	if err != nil {
		return "", fmt.Errorf("sign envd token: %w", err)
	}
	return tok, nil
}

func (s *server) sandboxOut(r *http.Request, sb model.Sandbox) (sandboxJSON, error) {
	ctx := r.Context()
	tok, err := s.envdToken(ctx, sb)
	if err != nil {
		return sandboxJSON{}, err
	}
	traffic, err := s.trafficToken(ctx, sb)
	if err != nil {
		return sandboxJSON{}, err
	}
	return sandboxJSON{
		SandboxID: sb.ID, TemplateID: sb.Template, Alias: alias(sb), ClientID: "airlock",
		EnvdVersion: EnvdVersion, EnvdAccessToken: tok, TrafficAccessToken: traffic, Domain: s.domain(r),
	}, nil
}

// domain is the sandbox domain of E2B answers, from which the SDKs build
// "<port>-<sandboxID>.<domain>" hosts (getHost, envd and signed file URLs
// when E2B_SANDBOX_URL is unset): Options.Domain when the operator set one,
// else the name the client reached this server by (with its port; the
// router accepts any such host), "localhost:<port>" for a loopback
// address (*.localhost names the loopback), and nil for another address
// (the SDK then uses E2B_DOMAIN), since "<port>-<id>.<IP>" names nothing.
func (s *server) domain(r *http.Request) *string {
	if s.domainName != "" {
		d := s.domainName
		return &d
	}
	host, port := r.Host, ""
	if h, p, err := net.SplitHostPort(r.Host); err == nil {
		host, port = h, p
	}
	if host == "" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil {
		if !ip.IsLoopback() {
			return nil
		}
		host = "localhost"
	}
	d := strings.ToLower(host)
	if port != "" {
		d = net.JoinHostPort(d, port)
	}
	return &d
}

// trafficToken is E2B's trafficAccessToken: the sandbox's traffic token,
// or nil when its ports are public.
func (s *server) trafficToken(ctx context.Context, sb model.Sandbox) (*string, error) {
	if sb.PublicTraffic {
		return nil, nil
	}
	tok, err := s.svc.TrafficToken(ctx, sb)
	if err != nil {
		return nil, err
	}
	return &tok, nil
}

// e2bNetwork reads E2B's create options allowInternetAccess and network
// (allowPublicTraffic: absent true, as in E2B; allowOut and denyOut: the
// egress lists, netpolicy.FromE2B). It returns the public-traffic flag and
// the egress the sandbox asks for (nil: its org's default profile). Other
// network settings (header transforms, egressProxy, maskRequestHost) are
// not built: 501.
func e2bNetwork(allowInternet *bool, raw json.RawMessage) (bool, *service.NetworkParams, error) {
	public := true
	var allowOut, denyOut []string
	if len(raw) > 0 && string(raw) != "null" {
		var n map[string]json.RawMessage
		if err := json.Unmarshal(raw, &n); err != nil {
			return false, nil, badRequest("network is not an object: %v", err)
		}
		for k, v := range n {
			switch vs := strings.TrimSpace(string(v)); {
			case vs == "null":
			case k == "allowPublicTraffic":
				if err := json.Unmarshal(v, &public); err != nil {
					return false, nil, badRequest("network.allowPublicTraffic is %s; it must be true or false", vs)
				}
			case k == "allowOut" || k == "denyOut":
				var list []string
				if err := json.Unmarshal(v, &list); err != nil {
					return false, nil, badRequest("network.%s is %.80s; it must be a list of CIDRs, IPs or domain names", k, vs)
				}
				if k == "allowOut" {
					allowOut = list
				} else {
					denyOut = list
				}
			case vs == "[]", vs == "{}", vs == `""`:
				// an empty setting is no setting
			default:
				return false, nil, notSupported("network.%s is not supported by Airlock; network.allowOut, network.denyOut and network.allowPublicTraffic are", k)
			}
		}
	}
	np, err := egressParams(allowInternet, allowOut, denyOut)
	return public, np, err
}

// egressParams maps E2B's egress settings onto a network choice: nothing
// set (or internet allowed with no lists) is the org's default; internet
// denied with no lists is the "none" profile; lists are an inline policy.
func egressParams(allowInternet *bool, allowOut, denyOut []string) (*service.NetworkParams, error) {
	if len(allowOut) == 0 && len(denyOut) == 0 {
		if allowInternet != nil && !*allowInternet {
			return &service.NetworkParams{Profile: netpolicy.ProfileNone}, nil
		}
		return nil, nil
	}
	pol, err := netpolicy.FromE2B(allowInternet, allowOut, denyOut)
	if err != nil {
		return nil, badRequest("network: %v", err)
	}
	b, err := json.Marshal(pol)
	if err != nil {
		return nil, err
	}
	return &service.NetworkParams{Policy: b}, nil
}

// e2bEgress is what getInfo reports of sb's egress.
func e2bEgress(sb model.Sandbox) (allowInternet bool, allowOut, denyOut []string) {
	if sb.Network == nil {
		return true, nil, nil // the worker's default
	}
	pol, err := netpolicy.Parse(sb.Network.Policy)
	if err != nil {
		return false, nil, nil
	}
	return pol.E2B()
}

// updateNetwork serves PUT /sandboxes/{id}/network {allowOut, denyOut,
// allowInternetAccess} (also accepted nested under "network"): 204.
func (s *server) updateNetwork(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req struct {
		AllowOut            []string `json:"allowOut"`
		DenyOut             []string `json:"denyOut"`
		AllowInternetAccess *bool    `json:"allowInternetAccess"`
		Network             *struct {
			AllowOut []string `json:"allowOut"`
			DenyOut  []string `json:"denyOut"`
		} `json:"network"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Network != nil {
		req.AllowOut, req.DenyOut = append(req.AllowOut, req.Network.AllowOut...), append(req.DenyOut, req.Network.DenyOut...)
	}
	id := r.PathValue("id")
	if _, err := s.visible(r.Context(), p, id); err != nil {
		return err
	}
	np, err := egressParams(req.AllowInternetAccess, req.AllowOut, req.DenyOut)
	if err != nil {
		return err
	}
	if np == nil {
		np = &service.NetworkParams{OrgDefault: true} // omitted settings are cleared
	}
	if _, err := s.svc.SetSandboxNetwork(r.Context(), p, id, *np); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func listed(sb model.Sandbox) listedSandbox {
	end := noExpiry
	if sb.ExpiresAt != nil {
		end = sb.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return listedSandbox{
		SandboxID: sb.ID, TemplateID: sb.Template, Alias: alias(sb), ClientID: "airlock",
		StartedAt: sb.CreatedAt.UTC().Format(time.RFC3339), EndAt: end, EnvdVersion: EnvdVersion,
		CPUCount: sb.Resources.VCPUs, MemoryMB: sb.Resources.MemoryMiB, State: e2bState(sb),
		Metadata: publicMetadata(sb.Metadata),
	}
}

// visible returns the caller's sandbox as E2B sees it: a sandbox being
// deleted, deleted or failed is not found.
func (s *server) visible(ctx context.Context, p service.Principal, id string) (model.Sandbox, error) {
	sb, err := s.svc.GetSandbox(ctx, p, id)
	if err != nil {
		return model.Sandbox{}, err
	}
	if e2bState(sb) == "" {
		why := "it was killed"
		if sb.State.Broken() {
			why = "it " + string(sb.State) + ": " + sb.Reason
		}
		return model.Sandbox{}, model.Errorf(model.ErrNotFound, "sandbox %s not found (%s)", id, why)
	}
	return sb, nil
}

func (s *server) create(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req newSandbox
	if err := decode(r, &req); err != nil {
		return err
	}
	public, egress, err := e2bNetwork(req.AllowInternetAccess, req.Network)
	if err != nil {
		return err
	}
	switch {
	case len(req.MCP) > 0 && string(req.MCP) != "null":
		return notSupported("MCP gateways are not supported by Airlock")
	case len(req.VolumeMounts) > 0 && string(req.VolumeMounts) != "null" && string(req.VolumeMounts) != "[]":
		return notSupported("volume mounts are not supported by Airlock")
	case len(req.IAM) > 0 && string(req.IAM) != "null" && string(req.IAM) != "{}":
		return notSupported("IAM tokens are not supported by Airlock")
	}
	// autoResume maps onto Airlock's auto-wake: a paused (suspended)
	// sandbox wakes on data-plane traffic. E2B's default, and so an
	// omitted autoResume, is off: traffic to a paused sandbox fails.
	autoWake := req.AutoResume != nil && req.AutoResume.Enabled
	timeout, err := sandboxTimeout(req.Timeout)
	if err != nil {
		return err
	}
	md := make(map[string]string, len(req.Metadata)+2)
	for k, v := range req.Metadata {
		if strings.HasPrefix(k, metaPrefix) {
			return badRequest("metadata keys starting with %q are reserved", metaPrefix)
		}
		md[k] = v
	}
	onExpiry := model.ExpiryDelete
	if req.AutoPause {
		onExpiry = model.ExpirySuspend
	}
	params := service.CreateParams{
		Env: req.EnvVars, Metadata: md, TimeoutS: timeout, OnExpiry: onExpiry, PublicTraffic: public,
		Network: egress, AutoWake: &autoWake,
	}
	if sid, name, ok := parseSnapshotID(req.TemplateID); ok {
		return s.createFromSnapshot(w, r, p, sid, name, params)
	}
	ref := templateRef(req.TemplateID)
	if req.TemplateID != "" && req.TemplateID != ref {
		md[metaAlias] = req.TemplateID
	}
	params.Template = ref
	sb, op, err := s.svc.CreateSandbox(r.Context(), p, params, r.Header.Get("Idempotency-Key"))
	if err != nil {
		return err
	}
	sb, err = s.waitOp(r.Context(), p, op, "start")
	if err != nil {
		return err
	}
	out, err := s.sandboxOut(r, sb)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// waitOp waits for op to finish (at most createWait) and returns the
// sandbox after it; a failed operation is an errFailed naming what.
func (s *server) waitOp(ctx context.Context, p service.Principal, op model.Operation, what string) (model.Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, s.createWait)
	defer cancel()
	for !op.State.Done() {
		var err error
		op, err = s.svc.WaitOperation(ctx, p, op.ID, service.MaxWait)
		if err != nil {
			return model.Sandbox{}, err
		}
		if ctx.Err() != nil && !op.State.Done() {
			return model.Sandbox{}, model.Errorf(model.ErrUnavailable, "sandbox %s did not %s within %s (operation %s is %s); retry or check `airlock op get %s`", op.SandboxID, what, s.createWait, op.ID, op.State, op.ID)
		}
	}
	if op.State != model.OpSucceeded {
		return model.Sandbox{}, errFailed{fmt.Sprintf("sandbox %s failed to %s: %s", op.SandboxID, what, op.Reason)}
	}
	return s.svc.GetSandbox(ctx, p, op.SandboxID)
}

func (s *server) list(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	f := service.ListParams{Cursor: q.Get("nextToken")}
	states := []string{"running", "paused"}
	if vs := q["state"]; len(vs) > 0 {
		states = nil
		for _, v := range vs {
			for _, st := range strings.Split(v, ",") {
				if st = strings.TrimSpace(st); st != "" {
					states = append(states, st)
				}
			}
		}
	}
	if r.URL.Path == "/sandboxes" && q.Get("state") == "" {
		states = []string{"running"} // the v1 list shows running sandboxes only
	}
	for _, st := range states {
		as, err := airlockStates(st)
		if err != nil {
			return err
		}
		f.States = append(f.States, as...)
	}
	if m := q.Get("metadata"); m != "" {
		md, err := decodeMetadataQuery(m)
		if err != nil {
			return err
		}
		f.Metadata = md
	}
	switch o := q.Get("order"); o {
	case "", "desc":
		f.Descending = true // E2B's default: newest first
	case "asc":
	default:
		return badRequest("order %q is not asc or desc", o)
	}
	if tpl := q.Get("template"); tpl != "" {
		f.Templates = []string{templateRef(tpl)}
	}
	if v := q.Get("startedAfter"); v != "" {
		after, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return badRequest("startedAfter %q is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)", v)
		}
		f.CreatedAfter = after
	}
	f.Limit = 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			return badRequest("limit %q is not a positive number", l)
		}
		f.Limit = min(n, service.MaxListLimit)
	}
	sbs, next, err := s.svc.ListSandboxes(r.Context(), p, f)
	if err != nil {
		return err
	}
	out := make([]listedSandbox, 0, len(sbs))
	for _, sb := range sbs {
		if e2bState(sb) == "" {
			continue
		}
		out = append(out, listed(sb))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// decodeMetadataQuery reads list's metadata filter as the SDKs encode it:
// each key and value percent-encoded (JS encodeURIComponent, Python
// quote), joined as a query string, which the query parameter encodes
// again. One decoding is the query parameter's; this undoes the other two.
// A key or value that is not percent-encoded (a hand-written filter with a
// literal '%') is taken as it is.
func decodeMetadataQuery(m string) (map[string]string, error) {
	pairs, err := url.ParseQuery(m)
	if err != nil {
		return nil, badRequest("metadata filter %.200q is not a URL-encoded key=value list: %v", m, err)
	}
	unescape := func(s string) string {
		if u, err := url.PathUnescape(s); err == nil {
			return u
		}
		return s
	}
	md := make(map[string]string, len(pairs))
	for k, v := range pairs {
		if len(v) > 0 {
			md[unescape(k)] = unescape(v[len(v)-1])
		}
	}
	return md, nil
}

func (s *server) get(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	sb, err := s.visible(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	tok, err := s.envdToken(r.Context(), sb)
	if err != nil {
		return err
	}
	onTimeout := "kill"
	if sb.OnExpiry == model.ExpirySuspend {
		onTimeout = "pause"
	}
	traffic, err := s.trafficToken(r.Context(), sb)
	if err != nil {
		return err
	}
	internet, allowOut, denyOut := e2bEgress(sb)
	writeJSON(w, http.StatusOK, sandboxDetail{
		listedSandbox: listed(sb), EnvdAccessToken: tok, TrafficAccessToken: traffic, Domain: s.domain(r),
		AllowInternetAccess: internet,
		Network:             networkJSON{AllowPublicTraffic: sb.PublicTraffic, AllowOut: allowOut, DenyOut: denyOut},
		Lifecycle:           lifecycleJSON{OnTimeout: onTimeout, AutoResume: !sb.NoAutoWake},
	})
	return nil
}

func (s *server) kill(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	id := r.PathValue("id")
	if _, err := s.visible(r.Context(), p, id); err != nil {
		return err
	}
	if _, err := s.svc.DeleteSandbox(r.Context(), p, id); err != nil {
		return err
	}
	// Deletion finishes in the background; from now on E2B sees the
	// sandbox as gone (GET answers 404, envd 502).
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *server) setTimeout(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Timeout == nil {
		return badRequest("timeout (seconds) is required")
	}
	id := r.PathValue("id")
	if _, err := s.visible(r.Context(), p, id); err != nil {
		return err
	}
	if _, err := s.svc.SetSandboxTimeout(r.Context(), p, id, time.Duration(*req.Timeout)*time.Second, false); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *server) refresh(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req struct {
		Duration *int `json:"duration"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	d := DefaultTimeout
	if req.Duration != nil {
		d = *req.Duration
	}
	id := r.PathValue("id")
	if _, err := s.visible(r.Context(), p, id); err != nil {
		return err
	}
	if _, err := s.svc.SetSandboxTimeout(r.Context(), p, id, time.Duration(d)*time.Second, true); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *server) pause(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	id := r.PathValue("id")
	sb, err := s.visible(r.Context(), p, id)
	if err != nil {
		return err
	}
	if e2bState(sb) == "paused" {
		return model.Errorf(model.ErrConflict, "sandbox %s is already paused", id)
	}
	if err := s.suspend(r.Context(), p, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// suspend suspends the sandbox (E2B pause) and waits until it is.
func (s *server) suspend(ctx context.Context, p service.Principal, id string) error {
	op, err := s.svc.SuspendSandbox(ctx, p, id)
	if err != nil {
		return err
	}
	_, err = s.waitOp(ctx, p, op, "pause")
	return err
}

// wake brings a paused (frozen) or suspended sandbox back and waits until
// it runs.
func (s *server) wake(ctx context.Context, p service.Principal, sb model.Sandbox) (model.Sandbox, error) {
	resume := s.svc.WakeSandbox
	if sb.State == model.StatePaused {
		resume = s.svc.ResumeSandbox
	}
	op, err := resume(ctx, p, sb.ID)
	if err != nil {
		return model.Sandbox{}, err
	}
	return s.waitOp(ctx, p, op, "resume")
}

// waitSettled waits for a sandbox that is starting, waking or suspending
// to settle.
func (s *server) waitSettled(ctx context.Context, p service.Principal, sb model.Sandbox) (model.Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, s.createWait)
	defer cancel()
	for sb.State == model.StatePending || sb.State == model.StateStarting || sb.State == model.StateWaking || sb.State == model.StateSuspending {
		changed := s.svc.EventsChanged()
		select {
		case <-changed:
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			return model.Sandbox{}, model.Errorf(model.ErrUnavailable, "sandbox %s is still %s; retry", sb.ID, sb.State)
		}
		var err error
		if sb, err = s.visible(ctx, p, sb.ID); err != nil {
			return model.Sandbox{}, err
		}
	}
	return sb, nil
}

func (s *server) connect(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	return s.connectOrResume(w, r, p, false)
}

func (s *server) resume(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	return s.connectOrResume(w, r, p, true)
}

// connectOrResume answers connect (200 running, 201 resumed) and the
// deprecated resume (201 resumed, 409 when already running).
func (s *server) connectOrResume(w http.ResponseWriter, r *http.Request, p service.Principal, resumeOnly bool) error {
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	sb, err := s.visible(r.Context(), p, id)
	if err != nil {
		if errors.Is(err, model.ErrNotFound) {
			return model.Errorf(model.ErrNotFound, "paused sandbox %s not found", id)
		}
		return err
	}
	if sb, err = s.waitSettled(r.Context(), p, sb); err != nil {
		return err
	}
	status := http.StatusOK
	if e2bState(sb) == "paused" {
		if sb, err = s.wake(r.Context(), p, sb); err != nil {
			return err
		}
		status = http.StatusCreated
	} else if resumeOnly {
		return model.Errorf(model.ErrConflict, "sandbox %s is already running", id)
	}
	// The TTL is measured from now: a resumed sandbox gets it afresh, a
	// running one only has it extended (E2B's default is 300 s). A sandbox
	// without expiry (a native one) keeps none, except one that autoPause
	// suspended (the controller cleared its expiry).
	timeout := DefaultTimeout
	if req.Timeout != nil && *req.Timeout > 0 {
		timeout = *req.Timeout
	}
	if sb.ExpiresAt != nil || sb.OnExpiry == model.ExpirySuspend && status == http.StatusCreated {
		if sb, err = s.svc.SetSandboxTimeout(r.Context(), p, id, time.Duration(timeout)*time.Second, status == http.StatusOK); err != nil {
			return err
		}
	}
	out, err := s.sandboxOut(r, sb)
	if err != nil {
		return err
	}
	writeJSON(w, status, out)
	return nil
}

func (s *server) metrics(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	sb, err := s.visible(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	out := []sandboxMetric{}
	if sb.State == model.StateRunning && s.envdGet != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		var m struct {
			TS         int64   `json:"ts"`
			CPUCount   int     `json:"cpu_count"`
			CPUUsedPct float64 `json:"cpu_used_pct"`
			MemTotal   int64   `json:"mem_total"`
			MemUsed    int64   `json:"mem_used"`
			MemCache   int64   `json:"mem_cache"`
			DiskUsed   int64   `json:"disk_used"`
			DiskTotal  int64   `json:"disk_total"`
		}
		if body, err := s.envdGet(ctx, sb, "/metrics"); err != nil {
			s.log.Debug("envd metrics unavailable", "sandbox", sb.ID, "err", err)
		} else if err := json.Unmarshal(body, &m); err != nil {
			s.log.Debug("envd metrics undecodable", "sandbox", sb.ID, "err", err)
		} else {
			ts := time.Now().UTC()
			if m.TS > 0 {
				ts = time.Unix(m.TS, 0).UTC()
			}
			if m.CPUCount == 0 {
				m.CPUCount = sb.Resources.VCPUs
			}
			out = append(out, sandboxMetric{
				Timestamp: ts.Format(time.RFC3339), TimestampUnix: ts.Unix(), CPUCount: m.CPUCount,
				CPUUsedPct: m.CPUUsedPct, MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache,
				DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal,
			})
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) metricsMany(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	return notSupported("metrics of several sandboxes at once are not supported by Airlock; ask each sandbox")
}

func (s *server) logs(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	if _, err := s.visible(r.Context(), p, r.PathValue("id")); err != nil {
		return err
	}
	// Airlock keeps no sandbox-level log; command output lives with each
	// command.
	writeJSON(w, http.StatusOK, map[string]any{"logs": []any{}, "logEntries": []any{}})
	return nil
}
