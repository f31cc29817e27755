package e2bcompat

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestEgressMapping: allowInternetAccess and network.allowOut/denyOut map
// onto the sandbox's egress policy (netpolicy.FromE2B); getInfo reports
// them; PUT /sandboxes/{id}/network replaces them.
func TestEgressMapping(t *testing.T) {
	e := newEnv(t)
	info := func(id string) sandboxDetail {
		t.Helper()
		r := e.do("GET", "/sandboxes/"+id, "")
		if r.status != 200 {
			t.Fatalf("getInfo: %d %s", r.status, r.body)
		}
		var d sandboxDetail
		if err := json.Unmarshal(r.body, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	policyOf := func(id string) string {
		t.Helper()
		sb, err := e.st.GetSandbox(e.ctx, id)
		if err != nil || sb.Network == nil {
			t.Fatalf("sandbox %s network %+v %v", id, sb.Network, err)
		}
		return sb.Network.Profile + " " + string(sb.Network.Policy)
	}

	open := e.create(`{"templateID":"base"}`)
	if d := info(open.SandboxID); !d.AllowInternetAccess || len(d.Network.AllowOut) != 0 {
		t.Errorf("default: internet %v allowOut %v", d.AllowInternetAccess, d.Network.AllowOut)
	}
	if p := policyOf(open.SandboxID); !strings.HasPrefix(p, "public ") {
		t.Errorf("default policy %s", p)
	}

	closed := e.create(`{"templateID":"base","allow_internet_access":false}`)
	if d := info(closed.SandboxID); d.AllowInternetAccess {
		t.Errorf("allow_internet_access false reported as true")
	}
	if p := policyOf(closed.SandboxID); !strings.HasPrefix(p, "none ") {
		t.Errorf("no internet policy %s", p)
	}

	listed := e.create(`{"templateID":"base","network":{"allowOut":["pypi.example.org","203.0.113.0/24"],"denyOut":["0.0.0.0/0"]}}`)
	d := info(listed.SandboxID)
	if d.AllowInternetAccess || strings.Join(d.Network.AllowOut, ",") != "pypi.example.org,203.0.113.0/24" || strings.Join(d.Network.DenyOut, ",") != "0.0.0.0/0" {
		t.Errorf("allow-list: internet %v allowOut %v denyOut %v", d.AllowInternetAccess, d.Network.AllowOut, d.Network.DenyOut)
	}
	if p := policyOf(listed.SandboxID); !strings.Contains(p, `"default":"deny"`) || !strings.Contains(p, "pypi.example.org") {
		t.Errorf("allow-list policy %s", p)
	}

	if r := e.do("PUT", "/sandboxes/"+open.SandboxID+"/network", `{"denyOut":["198.51.100.0/24"]}`); r.status != 204 {
		t.Fatalf("updateNetwork: %d %s", r.status, r.body)
	}
	if d := info(open.SandboxID); !d.AllowInternetAccess || strings.Join(d.Network.DenyOut, ",") != "198.51.100.0/24" {
		t.Errorf("after updateNetwork: internet %v denyOut %v", d.AllowInternetAccess, d.Network.DenyOut)
	}
	wantError(t, e.do("PUT", "/sandboxes/"+open.SandboxID+"/network", `{"allowOut":[7]}`), 400, "")
	wantError(t, e.do("PUT", "/sandboxes/sb-nope/network", `{"allowOut":["x.example.com"]}`), 404, "")
}
