package worker

// What a browser (the web console, internal/ui) needs of the data plane:
// the token as a WebSocket subprotocol, since a browser cannot set
// Authorization on a WebSocket, and CORS on the files routes, which it
// reaches from the server's origin. Over the fake runtime (fast tier).

import (
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
)

func TestBrowserDataPlaneFake(t *testing.T) {
	e := newFakeEnv(t)
	ctx := testContext(t)
	const id = "sbx-fake-browser"
	e.srv.assign(id, fakeDigest, model.StateRunning)
	e.waitState(id, model.StateRunning)
	base := sandboxURL(e.tw.w, id)

	attach := func(cid string, protocols ...string) (*websocket.Conn, *http.Response, error) {
		return websocket.Dial(ctx, base+"/commands/"+cid+"/attach", &websocket.DialOptions{
			Subprotocols: protocols,
			HTTPHeader:   http.Header{"Origin": []string{"http://console.example"}},
		})
	}
	cmdToken := func(cid string) string {
		return e.srv.sign(t, token.Claims{SandboxID: id, Scope: token.ScopeCommand,
			Command: &model.CommandSpec{ID: cid, SandboxID: id, Argv: []string{"echo", "hi"}}})
	}

	// The token as a subprotocol authorizes; the worker selects airlock.v1
	// and never echoes the token.
	conn, resp, err := attach("c-ws", AttachProtocol, TokenProtocolPrefix+cmdToken("c-ws"))
	if err != nil {
		t.Fatalf("attach with the token as a subprotocol: %v", err)
	}
	if got := conn.Subprotocol(); got != AttachProtocol {
		t.Fatalf("negotiated subprotocol %q, want %q", got, AttachProtocol)
	}
	if h := resp.Header.Get("Sec-WebSocket-Protocol"); strings.Contains(h, "v1.") {
		t.Fatalf("the answer echoes the token: %q", h)
	}
	var out strings.Builder
	exited := false
	for !exited {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v (output so far %q)", err, out.String())
		}
		if typ != websocket.MessageBinary || len(msg) == 0 {
			continue
		}
		switch msg[0] {
		case agentapi.FrameStdout:
			out.Write(msg[1:])
		case agentapi.FrameExit:
			exited = true
		}
	}
	conn.CloseNow()
	if out.String() != "hi\n" {
		t.Fatalf("stdout %q, want hi", out.String())
	}

	// A wrong token in the subprotocol is refused like a wrong header.
	bad := cmdToken("c-bad")
	bad = bad[:len(bad)-2] + "xx"
	if _, resp, err := attach("c-bad", AttachProtocol, TokenProtocolPrefix+bad); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("attach with a forged token: err %v, resp %v; want 401", err, resp)
	}
	// Without any token: 401 naming the subprotocol.
	if _, resp, err := attach("c-none", AttachProtocol); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("attach without a token: err %v, resp %v; want 401", err, resp)
	}

	// CORS: the preflight of a files upload, then a list's answer.
	req, _ := http.NewRequestWithContext(ctx, http.MethodOptions, base+"/files/content?path=/tmp/x", nil)
	req.Header.Set("Origin", "http://console.example")
	req.Header.Set("Access-Control-Request-Method", "PUT")
	req.Header.Set("Access-Control-Request-Headers", "authorization")
	pre, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	pre.Body.Close()
	if pre.StatusCode != http.StatusNoContent || pre.Header.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(pre.Header.Get("Access-Control-Allow-Methods"), "PUT") ||
		!strings.Contains(pre.Header.Get("Access-Control-Allow-Headers"), "Authorization") ||
		pre.Header.Get("Access-Control-Allow-Credentials") != "" {
		t.Fatalf("preflight: %d %v", pre.StatusCode, pre.Header)
	}
	e.write(id, "a.txt", "x")
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, base+"/files/list?path=.", nil)
	req.Header.Set("Origin", "http://console.example")
	req.Header.Set("Authorization", "Bearer "+e.srv.sign(t, token.Claims{SandboxID: id, Scope: token.ScopeFiles}))
	list, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	list.Body.Close()
	if list.StatusCode != http.StatusOK || list.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("list: %d %v", list.StatusCode, list.Header)
	}
}
