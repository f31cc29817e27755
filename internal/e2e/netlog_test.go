package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/egress/egresstest"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
)

// TestEgressNetworkLog: under `airlock up --egress --metrics-addr`, a
// real gVisor sandbox whose policy allows only the test internet's www:
// curl to www succeeds and appears as allowed in GET network/log; curl to
// another name is refused at DNS, and the refusal arrives as a
// network.denied event on the sandbox's SSE stream (name, rule, reason)
// and as a denied entry in the log; /metrics counts both; the CLI prints
// the log.
func TestEgressNetworkLog(t *testing.T) {
	s := need(t)
	in := egresstest.Start(t, egresstest.Config{})
	metricsAddr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	u := newUp(t, s, "http")
	up := u.start(t, s, http.DefaultClient, "--qemu=false", "--template-images", "",
		"--egress", "--egress-resolver", in.DNS.String(), "--metrics-addr", metricsAddr)
	t.Cleanup(func() { kill(up, syscall.SIGTERM) })
	c := client.New(u.url, u.adminKey())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	www, other := egresstest.Name(egresstest.WWW), egresstest.Name(egresstest.Other)
	policy := `{"version":1,"default":"deny","rules":[{"action":"allow","domains":["` + www + `"]}]}`
	id := newSandbox(t, c, client.CreateSandboxRequest{Network: &apitypes.NetworkRequest{Policy: json.RawMessage(policy)}}).ID
	if !network.HasGateway(id) {
		t.Fatalf("sandbox %s has no gateway namespace: is --egress on?", id)
	}

	denials := make(chan model.NetDenial, 64)
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	go func() {
		for ev, err := range c.Events(sctx, id, 0) {
			if err != nil {
				return
			}
			if ev.Type == "network.denied" {
				var d model.NetDenial
				if json.Unmarshal(ev.Data, &d) == nil {
					denials <- d
				}
			}
		}
	}()

	out, rc, ms := timed(t, c, id, "curl -sS -m 20 http://"+www+"/allowed")
	t.Logf("curl %s: rc=%d in %d ms: %s", www, rc, ms, out)
	if rc != 0 || !strings.Contains(out, "path=/allowed") {
		t.Fatalf("allowed request: rc=%d: %s", rc, out)
	}
	out, rc, ms = timed(t, c, id, "curl -sS -m 20 http://"+other+"/denied")
	t.Logf("curl %s: rc=%d in %d ms: %s", other, rc, ms, out)
	if rc == 0 || rc == 28 {
		t.Fatalf("denied request: curl rc=%d (want a refusal, not success or a timeout): %s", rc, out)
	}

	var d model.NetDenial
	for d.Name != other {
		select {
		case d = <-denials:
			t.Logf("network.denied: %+v", d)
		case <-ctx.Done():
			t.Fatalf("no network.denied event for %s on the sandbox's stream", other)
		}
	}
	if d.Kind != "dns" || d.Decision != "denied" || d.Rule != -1 || d.Code != "default" || d.Reason != "default deny" || d.Count < 1 || d.Seq < 1 {
		t.Errorf("network.denied for %s: %+v", other, d)
	}

	lg, err := c.NetworkLog(ctx, id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var allowedDNS, allowedTCP, deniedDNS bool
	for _, e := range lg.Entries {
		t.Logf("log %d: %s %s name=%s ip=%s port=%d rule=%d code=%s reason=%q", e.Seq, e.Kind, e.Decision, e.Name, e.IP, e.Port, e.Rule, e.Code, e.Reason)
		switch {
		case e.Kind == "dns" && e.Decision == "allowed" && e.Name == www && e.Rule == 0 && e.Code == "rule":
			allowedDNS = true
		case e.Kind == "tcp" && e.Decision == "allowed" && e.Name == www && e.IP == in.Addr(2).String() && e.Port == 80 && e.Rule == 0:
			allowedTCP = true
		case e.Kind == "dns" && e.Decision == "denied" && e.Name == other && e.Code == "default":
			deniedDNS = true
		}
	}
	if !allowedDNS || !allowedTCP || !deniedDNS {
		t.Errorf("network log lacks an entry: allowed dns %v, allowed tcp %v, denied dns %v", allowedDNS, allowedTCP, deniedDNS)
	}

	res, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, series := range []string{
		`airlock_egress_decisions_total{decision="allowed",kind="dns",reason="rule"}`,
		`airlock_egress_decisions_total{decision="allowed",kind="tcp",reason="rule"}`,
		`airlock_egress_decisions_total{decision="denied",kind="dns",reason="default"}`,
	} {
		m := regexp.MustCompile(regexp.QuoteMeta(series) + ` (\d+)`).FindStringSubmatch(string(body))
		if m == nil || m[1] == "0" {
			t.Errorf("/metrics: %s is not counted:\n%s", series, grepLines(string(body), "airlock_egress"))
		}
	}

	cli := airlockCLI(t, s, append(os.Environ(), "AIRLOCK_URL="+u.url, "AIRLOCK_API_KEY="+u.adminKey()))
	if out, code := cli("", "sandbox", "network", "log", id); code != 0 || !strings.Contains(out, other) || !strings.Contains(out, "default deny") || !strings.Contains(out, "allowed") {
		t.Errorf("airlock sandbox network log: exit %d:\n%s", code, out)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
