package redteam

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/egress/egresstest"
	"github.com/airlock/airlock/internal/testenv"
)

//go:embed probe.py
var probePy string

// probeResult is probe.py's line.
type probeResult struct {
	OK     bool     `json:"ok"`
	Detail string   `json:"detail"`
	MS     float64  `json:"ms"`
	Rcode  *int     `json:"rcode"`
	IPs    []string `json:"ips"`
}

// row is one line of the result table.
type row struct {
	Case, Runtime, Attempt, Outcome, How string
}

// report collects the rows of the suites and writes them, sorted by
// runtime then order, to $AIRLOCK_REDTEAM_REPORT at the end.
type report struct {
	mu   sync.Mutex
	rows []row
}

var results report

func (r *report) add(x row) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rows = append(r.rows, x)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if p := os.Getenv("AIRLOCK_REDTEAM_REPORT"); p != "" && len(results.rows) > 0 {
		var b bytes.Buffer
		bypasses, known := 0, 0
		fmt.Fprintf(&b, "| case | runtime | attempt | outcome | how it failed |\n|---|---|---|---|---|\n")
		for _, x := range results.rows {
			switch x.Outcome {
			case "BYPASS":
				bypasses++
			case "KNOWN BYPASS":
				known++
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", x.Case, x.Runtime, cell(x.Attempt), x.Outcome, cell(x.How))
		}
		fmt.Fprintf(&b, "\n%d cases, %d bypasses, %d known bypasses (%s).\n", len(results.rows), bypasses, known, time.Now().UTC().Format("2006-01-02"))
		if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "redteam: write report:", err)
		}
	}
	os.Exit(code)
}

func cell(s string) string {
	s = strings.ReplaceAll(s, "|", "\\|")
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// guest runs probe.py attempts somewhere (a gVisor sandbox, a namespace).
type guest interface {
	probe(t *testing.T, args ...string) probeResult
	shell(t *testing.T, script string) (string, int)
}

// deniedLog returns the gateway's denials after mark, as lines.
type deniedLog interface {
	mark() int
	since(mark int) []string
}

// suite runs cases and records their rows.
type suite struct {
	runtime string
	log     deniedLog
	// skip, if set, says why a case is not run in this tier ("": run it);
	// a skipped case gets a row saying so.
	skip func(name string) string
}

// attempt is one red-team case: run returns whether it got through (a
// bypass) and what happened; denied, when the gateway is involved,
// matches the log line that must record the denial (none: the attempt
// does not reach the gateway, e.g. dropped by the filter or refused by
// the guest's own kernel).
type attempt struct {
	name, what string
	run        func(t *testing.T) (bypass bool, how string)
	denied     *regexp.Regexp
	// notAttemptable: run says the guest cannot even make the attempt
	// (e.g. no raw sockets); reported as such, still a failure for the
	// attacker.
	notAttemptable func(how string) bool
}

func (s *suite) check(t *testing.T, a attempt) {
	t.Helper()
	if s.skip != nil {
		if why := s.skip(a.name); why != "" {
			t.Logf("%-28s %-16s %s", a.name, "skipped", why)
			results.add(row{Case: a.name, Runtime: s.runtime, Attempt: a.what, Outcome: "skipped", How: why})
			return
		}
	}
	m := s.log.mark()
	bypass, how := a.run(t)
	outcome := "blocked"
	if bypass {
		outcome = "BYPASS"
		t.Errorf("BYPASS %s (%s): %s", a.name, a.what, how)
	} else if a.notAttemptable != nil && a.notAttemptable(how) {
		outcome = "not attemptable"
	}
	if !bypass && a.denied != nil {
		var line string
		for i := 0; i < 60 && line == ""; i++ { // the log is written before the reset; allow for buffering
			for _, l := range s.log.since(m) {
				if a.denied.MatchString(l) {
					line = l
					break
				}
			}
			if line == "" {
				time.Sleep(50 * time.Millisecond)
			}
		}
		if line == "" {
			t.Errorf("%s: failed but the gateway logged no denial matching %s; denials since: %q", a.name, a.denied, s.log.since(m))
			outcome = "failed, NOT LOGGED"
		} else {
			how += "; gateway: " + reasonOf(line)
		}
	}
	t.Logf("%-28s %-16s %s", a.name, outcome, how)
	results.add(row{Case: a.name, Runtime: s.runtime, Attempt: a.what, Outcome: outcome, How: how})
}

var reasonRE = regexp.MustCompile(`kind=(\S+) .*reason=("(?:[^"\\]|\\.)*"|\S+)`)

func reasonOf(line string) string {
	if m := reasonRE.FindStringSubmatch(line); m != nil {
		return "denied (" + m[1] + ") " + strings.Trim(m[2], `"`)
	}
	return line
}

// deniedTCP matches a denial of a connection to ip:port (any kind).
func deniedTCP(ip string, port int) *regexp.Regexp {
	return regexp.MustCompile(`egress denied.* ip=` + regexp.QuoteMeta(ip) + ` port=` + fmt.Sprint(port) + ` `)
}

func deniedRE(s string) *regexp.Regexp { return regexp.MustCompile(`egress denied.*` + s) }

// deniedRebind matches the gateway's DNS refusing name, which resolves
// only to addresses no connection may reach.
func deniedRebind(name string) *regexp.Regexp {
	return regexp.MustCompile(`egress denied.* kind=dns name=` + regexp.QuoteMeta(name) + `\.? .*DNS rebinding`)
}

// --- the gVisor tier -----------------------------------------------------

// cacheDir is the test cache (runsc, the Debian layer) shared with the
// e2e suite.
func cacheDir() string {
	if d := os.Getenv("AIRLOCK_TEST_CACHE"); d != "" {
		return d
	}
	return "/var/tmp/airlock-test-cache"
}

// buildAirlock builds airlock and airlock-agent into the cache.
func buildAirlock(t *testing.T) string {
	t.Helper()
	testenv.RequireGoBuild(t, "airlock and airlock-agent")
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	bin := filepath.Join(cacheDir(), "redteam", "bin")
	for _, b := range []struct{ pkg, cgo string }{{"./cmd/airlock", "1"}, {"./cmd/airlock-agent", "0"}} {
		cmd := exec.Command("go", "build", "-o", bin+"/", b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return bin
}

// upLog is an airlock up log file.
type upLog struct{ path string }

func (l upLog) read() []byte { b, _ := os.ReadFile(l.path); return b }
func (l upLog) mark() int    { return len(l.read()) }
func (l upLog) since(m int) []string {
	b := l.read()
	if m > len(b) {
		m = 0
	}
	var out []string
	for _, s := range strings.Split(string(b[m:]), "\n") {
		if strings.Contains(s, "egress denied") {
			out = append(out, s)
		}
	}
	return out
}

// freePort is a free TCP port on addr.
func freePort(t *testing.T, addr netip.Addr) int {
	t.Helper()
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// sandbox is a gVisor sandbox of the instance; attempts run as root.
type sandbox struct {
	c  *client.Client
	id string
}

func (s sandbox) run(t *testing.T, argv ...string) (string, string, agentapi.Exit) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, err := s.c.CreateCommand(ctx, s.id, client.CreateCommandRequest{Argv: argv, User: "root"})
	if err != nil {
		t.Fatalf("create command %v: %v", argv, err)
	}
	var out, errb bytes.Buffer
	exit, err := client.RunCommand(ctx, cmd.AttachURL, cmd.Token, nil, &out, &errb)
	if err != nil {
		t.Fatalf("run %v: %v", argv, err)
	}
	return out.String(), errb.String(), exit
}

func (s sandbox) shell(t *testing.T, script string) (string, int) {
	t.Helper()
	out, errs, exit := s.run(t, "/bin/sh", "-c", script)
	return out + errs, exit.ExitCode
}

func (s sandbox) probe(t *testing.T, args ...string) probeResult {
	t.Helper()
	out, errs, _ := s.run(t, append([]string{"python3", "/tmp/probe.py"}, args...)...)
	return parseProbe(t, args, out, errs)
}

func parseProbe(t *testing.T, args []string, out, errs string) probeResult {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r probeResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("probe %v: no result line: %q %q", args, out, errs)
	}
	return r
}

// newSandbox creates a sandbox of runtime rt ("": the default), puts
// probe.py in it and deletes it at the end.
func newSandbox(t *testing.T, c *client.Client, rt string) sandbox {
	t.Helper()
	timeout := 2 * time.Minute
	if rt == "qemu" {
		timeout = 15 * time.Minute // the runtime's background set-up in a fresh instance
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: rt}, "")
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if op, err := c.DeleteSandbox(ctx, sb.ID); err == nil {
			c.WaitOperation(ctx, op.ID)
		}
	})
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatalf("create operation: %v", err)
	}
	s := sandbox{c: c, id: sb.ID}
	if out, code := s.shell(t, "cat > /tmp/probe.py <<'AIRLOCK_EOF'\n"+probePy+"AIRLOCK_EOF\n"); code != 0 {
		t.Fatalf("write probe.py: %s", out)
	}
	return s
}

// hostAddrs are the host's IPv4 addresses other than loopback.
func hostAddrs() []string {
	var out []string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			out = append(out, n.IP.String())
		}
	}
	return out
}

// listeningPorts are the host's TCP ports listening on every address
// (from /proc/net/tcp), besides 22.
func listeningPorts() []int {
	ports := map[int]bool{22: true}
	b, _ := os.ReadFile("/proc/net/tcp")
	for _, l := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) > 3 && f[3] == "0A" && strings.HasPrefix(f[1], "00000000:") {
			var p int
			fmt.Sscanf(f[1][9:], "%X", &p)
			ports[p] = true
		}
	}
	var out []int
	for p := range ports {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

const httpGet = `GET /redteam HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n`

// refusedOrReset: the attempt got nothing back.
func failed(r probeResult) (bool, string) { return r.OK, r.Detail }

// upEnv is a running `airlock up --egress` of a tier: its admin client,
// its log and the ports of its API and data plane (on the test
// internet's host address).
type upEnv struct {
	c                 *client.Client
	log               upLog
	apiPort, dataPort int
}

// startUp starts `airlock up --egress --egress-profile public` whose
// gateway resolves through in, for runtime rt (gvisor: QEMU off; qemu:
// QEMU on, sharing the cache's QEMU assets and template images), and
// stops it when t ends.
func startUp(t *testing.T, in *egresstest.Internet, rt string) upEnv {
	t.Helper()
	bin := buildAirlock(t)

	// The instance listens on the test internet's host address (a public
	// range the guard does not block as such: only as the host's own).
	dir := t.TempDir()
	t.Cleanup(func() { syscall.Unmount(filepath.Join(dir, "runsc", "null-netns"), syscall.MNT_DETACH) })
	links := []string{"cache", "bin"}
	runtimeArgs := []string{"--qemu=false"}
	if rt == "qemu" {
		links = append(links, "qemu", "images")
		runtimeArgs = nil
	}
	for _, d := range links {
		if err := os.MkdirAll(filepath.Join(cacheDir(), d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(cacheDir(), d), filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
	}
	apiPort := freePort(t, in.HostAddr)
	dataPort := freePort(t, in.HostAddr)
	api := netip.AddrPortFrom(in.HostAddr, uint16(apiPort)).String()
	log := upLog{filepath.Join(dir, "up.log")}
	logf, err := os.Create(log.path)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"up", "--listen", api,
		"--data-listen", netip.AddrPortFrom(in.HostAddr, uint16(dataPort)).String(), "--data-dir", dir},
		runtimeArgs...)
	args = append(args, "--template-images", "", "--egress", "--egress-resolver", in.DNS.String(), "--egress-profile", "public")
	up := exec.Command(filepath.Join(bin, "airlock"), args...)
	up.Stdout, up.Stderr = logf, logf
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() {
		up.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { up.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			up.Process.Kill()
			<-done
		}
	})
	deadline := time.Now().Add(5 * time.Minute)
	key := ""
	for {
		resp, err := http.Get("http://" + api + "/healthz")
		if err == nil {
			resp.Body.Close()
			b, _ := os.ReadFile(filepath.Join(dir, "admin.key"))
			if key = strings.TrimSpace(string(b)); resp.StatusCode == 200 && key != "" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("airlock up not healthy:\n%s", log.read())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return upEnv{c: client.New("http://"+api, key), log: log, apiPort: apiPort, dataPort: dataPort}
}

// TestRedTeamGVisor runs the red-team cases from two gVisor sandboxes of a
// real `airlock up --egress --egress-profile public`.
func TestRedTeamGVisor(t *testing.T) {
	testenv.RequireRunsc(t)
	in := egresstest.Start(t, egresstest.Config{})
	env := startUp(t, in, "gvisor")
	a, b := newSandbox(t, env.c, ""), newSandbox(t, env.c, "")
	sandboxCases(t, &suite{runtime: "gVisor", log: env.log}, in, env, a, b)
}

// sandboxCases are the attempts from sandbox A of env (B serves a port);
// s.skip leaves some out.
func sandboxCases(t *testing.T, s *suite, in *egresstest.Internet, env upEnv, a, b sandbox) {
	apiPort, dataPort := env.apiPort, env.dataPort
	inet2 := in.Addr(2).String()
	www := egresstest.Name(egresstest.WWW)

	// Sanity: the path works, so that failures below are the gateway's.
	if r := a.probe(t, "tcp", www, "80", fmt.Sprintf(httpGet, www)); !r.OK || !strings.Contains(r.Detail, "airlock-inet") {
		t.Fatalf("sanity: sandbox A cannot reach %s: %s", www, r.Detail)
	}

	noRaw := func(how string) bool { return !strings.Contains(how, "opened") }
	for _, x := range []attempt{
		{name: "dns-forge-self", what: "as root, rewrite /etc/resolv.conf to another resolver (the guest's own view of DNS)",
			run: func(t *testing.T) (bool, string) { return failed(a.probe(t, "resolv")) }},
		{name: "dns-forge-hosts-private", what: "forged local answer: /etc/hosts maps www.test.airlock to 10.0.0.1, then curl it",
			run: func(t *testing.T) (bool, string) {
				out, rc := a.shell(t, "had=0; [ -e /etc/hosts ] && had=1 && cp /etc/hosts /tmp/hosts.bak; echo '10.0.0.1 "+www+"' >> /etc/hosts; curl -sS -m 15 http://"+www+"/forged; rc=$?; if [ $had = 1 ]; then cp /tmp/hosts.bak /etc/hosts; else rm -f /etc/hosts; fi; exit $rc")
				return rc == 0, fmt.Sprintf("curl rc=%d: %s", rc, strings.TrimSpace(out))
			}, denied: deniedTCP("10.0.0.1", 80)},
		{name: "dns-forge-to-gateway", what: "18 forged DNS responses (QR=1, www → 10.0.0.1) sent to the gateway's resolver 100.64.0.1:53, then a real query",
			run: func(t *testing.T) (bool, string) { return failed(a.probe(t, "forge_gateway", www, "10.0.0.1")) }},
		{name: "raw-socket-spoof", what: "raw IP / packet socket: forged DNS answer from 100.64.0.1:53 to itself and a UDP datagram from 10.9.9.9",
			run: func(t *testing.T) (bool, string) {
				r := a.probe(t, "raw", inet2)
				return r.OK && in.UDPSeen()[netip.MustParseAddrPort("0.0.0.0:9999")] > 0, r.Detail
			}, notAttemptable: noRaw},
		{name: "spoof-bind-foreign-src", what: "bind a foreign source (10.9.9.9, IP_FREEBIND/IP_TRANSPARENT) and connect to the test internet",
			run: func(t *testing.T) (bool, string) { return failed(a.probe(t, "bind", "10.9.9.9", inet2, "80")) }},
		{name: "spoof-bind-gateway-src", what: "bind the gateway's address 100.64.0.1 as source and connect",
			run: func(t *testing.T) (bool, string) { return failed(a.probe(t, "bind", "100.64.0.1", inet2, "80")) }},
		{name: "front-connect-to-private", what: "allowed name, SNI and Host www.test.airlock, sent to 10.0.0.1:443 (curl --connect-to)",
			run: func(t *testing.T) (bool, string) {
				out, rc := a.shell(t, "curl -sS -m 15 -k --connect-to "+www+":443:10.0.0.1:443 https://"+www+"/front")
				return rc == 0, fmt.Sprintf("curl rc=%d: %s", rc, strings.TrimSpace(out))
			}, denied: deniedTCP("10.0.0.1", 443)},
		{name: "front-resolve-metadata", what: "allowed name www.test.airlock pinned to 169.254.169.254:80 (curl --resolve)",
			run: func(t *testing.T) (bool, string) {
				out, rc := a.shell(t, "curl -sS -m 15 --resolve "+www+":80:169.254.169.254 http://"+www+"/front")
				return rc == 0, fmt.Sprintf("curl rc=%d: %s", rc, strings.TrimSpace(out))
			}, denied: deniedTCP("169.254.169.254", 80)},
		{name: "raw-ip-10/8", what: "connect to 10.0.0.1:80 without DNS",
			run: func(t *testing.T) (bool, string) {
				return failed(a.probe(t, "tcp", "10.0.0.1", "80", fmt.Sprintf(httpGet, "10.0.0.1")))
			},
			denied: deniedTCP("10.0.0.1", 80)},
		{name: "raw-ip-172.16/12", what: "TLS to 172.16.0.1:443 without DNS (SNI www.test.airlock)",
			run:    func(t *testing.T) (bool, string) { return failed(a.probe(t, "tls", "172.16.0.1", "443", www)) },
			denied: deniedTCP("172.16.0.1", 443)},
		{name: "raw-ip-192.168/16-silent", what: "connect to 192.168.0.1:22 without DNS and send nothing (server-speaks-first, as SSH); the probe gives up after 8 s",
			run:    func(t *testing.T) (bool, string) { return failed(a.probe(t, "tcp", "192.168.0.1", "22", "-")) },
			denied: deniedTCP("192.168.0.1", 22)},
		{name: "raw-ip-cgnat", what: "connect to 100.64.1.1:80 (shared address space, sandboxes' range)",
			run: func(t *testing.T) (bool, string) {
				return failed(a.probe(t, "tcp", "100.64.1.1", "80", fmt.Sprintf(httpGet, "x")))
			},
			denied: deniedTCP("100.64.1.1", 80)},
		{name: "rebind-private", what: "rebind.test.airlock (A 10.0.0.1) over HTTP: the gateway's DNS leaves the address out (REFUSED)",
			run: func(t *testing.T) (bool, string) {
				n := egresstest.Name(egresstest.Rebind)
				return failed(a.probe(t, "tcp", n, "80", fmt.Sprintf(httpGet, n)))
			}, denied: deniedRebind(egresstest.Name(egresstest.Rebind))},
		{name: "rebind-loopback", what: "loop.test.airlock (A 127.0.0.1) over HTTP: left out of the answer (REFUSED)",
			run: func(t *testing.T) (bool, string) {
				n := egresstest.Name(egresstest.Loop)
				return failed(a.probe(t, "tcp", n, "80", fmt.Sprintf(httpGet, n)))
			}},
		{name: "rebind-metadata", what: "meta.test.airlock (A 169.254.169.254) over HTTP: left out of the answer (REFUSED)",
			run: func(t *testing.T) (bool, string) {
				n := egresstest.Name(egresstest.Meta)
				return failed(a.probe(t, "tcp", n, "80", fmt.Sprintf(httpGet, n)))
			}, denied: deniedRebind(egresstest.Name(egresstest.Meta))},
		{name: "rebind-host", what: "host.test.airlock (A = the host's veth address, where the API listens) on the API port",
			run: func(t *testing.T) (bool, string) {
				n := egresstest.Name(egresstest.HostN)
				return failed(a.probe(t, "tcp", n, fmt.Sprint(apiPort), fmt.Sprintf(httpGet, n)))
			}, denied: deniedRebind(egresstest.Name(egresstest.HostN))},
		{name: "udp-out", what: "3 UDP datagrams to the test internet's 198.18.x.2:9999 (a listening sink)",
			run: func(t *testing.T) (bool, string) {
				r := a.probe(t, "udp", inet2, "9999")
				time.Sleep(200 * time.Millisecond)
				n := in.UDPSeen()[netip.MustParseAddrPort("0.0.0.0:9999")]
				return r.OK || n > 0, fmt.Sprintf("%s; the sink received %d", r.Detail, n)
			}, denied: deniedRE(`kind=udp .*ip=` + regexp.QuoteMeta(inet2) + ` port=9999 `)},
		{name: "quic-out", what: "QUIC-like UDP 443 to the test internet (a listening sink)",
			run: func(t *testing.T) (bool, string) {
				r := a.probe(t, "udp", inet2, "443", `\xc0\x00\x00\x00\x01quic-initial`)
				time.Sleep(200 * time.Millisecond)
				n := in.UDPSeen()[netip.MustParseAddrPort("0.0.0.0:443")]
				return r.OK || n > 0, fmt.Sprintf("%s; the sink received %d", r.Detail, n)
			}, denied: deniedRE(`kind=udp .*ip=` + regexp.QuoteMeta(inet2) + ` port=443 `)},
		{name: "dns-other-resolver-udp", what: "query www.test.airlock at 8.8.8.8:53 (UDP): must be the gateway answering",
			run: func(t *testing.T) (bool, string) {
				before := len(in.DNSQueries())
				r := a.probe(t, "dns", "8.8.8.8", www, "1")
				viaGateway := len(in.DNSQueries()) > before && len(r.IPs) == 1 && r.IPs[0] == inet2
				return !viaGateway, fmt.Sprintf("%s (the test DNS was asked: %v, so the gateway answered and 8.8.8.8 never did)", r.Detail, viaGateway)
			}},
		{name: "dns-other-resolver-tcp", what: "query www.test.airlock at 8.8.8.8:53 over TCP: must be the gateway answering",
			run: func(t *testing.T) (bool, string) {
				before := len(in.DNSQueries())
				r := a.probe(t, "dns", "8.8.8.8", www, "1", "tcp")
				viaGateway := len(in.DNSQueries()) > before && len(r.IPs) == 1 && r.IPs[0] == inet2
				return !viaGateway, fmt.Sprintf("%s (the test DNS was asked: %v, so the gateway answered and 8.8.8.8 never did)", r.Detail, viaGateway)
			}},
		{name: "dns-sink-port-53", what: "query at the test internet's UDP sink 198.18.x.3:53",
			run: func(t *testing.T) (bool, string) {
				r := a.probe(t, "dns", in.Addr(3).String(), www, "1")
				n := in.UDPSeen()[netip.AddrPortFrom(in.Addr(3), 53)]
				return n > 0, fmt.Sprintf("%s; the sink received %d (answered by the gateway instead)", r.Detail, n)
			}},
		{name: "dns-txt-tunnel", what: "TXT query (a DNS tunnel's carrier) for www.test.airlock",
			run: func(t *testing.T) (bool, string) {
				r := a.probe(t, "dns", "100.64.0.1", www, "16")
				return r.Rcode == nil || *r.Rcode != 5, r.Detail
			}, denied: deniedRE(`kind=dns name=` + regexp.QuoteMeta(www))},
		{name: "ipv6", what: "AAAA of six.test.airlock, then connect to the test internet's IPv6 server [" + in.Addr6(2).String() + "]:80",
			run: func(t *testing.T) (bool, string) {
				d := a.probe(t, "dns", "100.64.0.1", egresstest.Name(egresstest.Six), "28")
				r := a.probe(t, "ipv6", in.Addr6(2).String(), "80")
				return r.OK, "AAAA: " + d.Detail + "; " + r.Detail
			}},
		{name: "ipv4-mapped-ipv6", what: "connect to [::ffff:10.0.0.1]:80",
			run: func(t *testing.T) (bool, string) { return failed(a.probe(t, "ipv6", "::ffff:10.0.0.1", "80")) }},
		{name: "icmp", what: "ICMP echo (ping socket and raw) with a tunnel payload to the test internet",
			run: func(t *testing.T) (bool, string) { return failed(a.probe(t, "icmp", inet2)) }},
		{name: "metadata", what: "GET 169.254.169.254:80 with Host metadata.google.internal",
			run: func(t *testing.T) (bool, string) {
				return failed(a.probe(t, "tcp", "169.254.169.254", "80", fmt.Sprintf(httpGet, "metadata.google.internal")))
			}, denied: deniedTCP("169.254.169.254", 80)},
		{name: "link-local", what: "connect to 169.254.1.1:443",
			run:    func(t *testing.T) (bool, string) { return failed(a.probe(t, "tls", "169.254.1.1", "443", www)) },
			denied: deniedTCP("169.254.1.1", 443)},
		{name: "host-loopback", what: "127.0.0.1 on the API port (the guest's loopback is its own)",
			run: func(t *testing.T) (bool, string) {
				return failed(a.probe(t, "tcp", "127.0.0.1", fmt.Sprint(apiPort), fmt.Sprintf(httpGet, "127.0.0.1")))
			}},
		{name: "gateway-address-ports", what: "the gateway's 100.64.0.1 on the proxy port 15001 and on the API port",
			run: func(t *testing.T) (bool, string) {
				r1 := a.probe(t, "tcp", "100.64.0.1", "15001", fmt.Sprintf(httpGet, "x"))
				r2 := a.probe(t, "tcp", "100.64.0.1", fmt.Sprint(apiPort), fmt.Sprintf(httpGet, "x"))
				return r1.OK || r2.OK, "15001: " + r1.Detail + "; API port: " + r2.Detail
			}, denied: deniedTCP("100.64.0.1", apiPort)},
	} {
		s.check(t, x)
	}

	// The host's own addresses: the API, the data plane, SSH and every
	// port listening on all addresses.
	ports := append([]int{apiPort, dataPort}, listeningPorts()...)
	for _, h := range hostAddrs() {
		for _, p := range ports {
			h, p := h, p
			s.check(t, attempt{name: fmt.Sprintf("host-%s:%d", h, p), what: fmt.Sprintf("the host's address %s port %d", h, p),
				run: func(t *testing.T) (bool, string) {
					return failed(a.probe(t, "tcp", h, fmt.Sprint(p), fmt.Sprintf(httpGet, h)))
				},
				denied: deniedTCP(h, p)})
		}
	}

	// Other sandboxes: B serves HTTP on 8000; both have 100.64.0.2.
	if out, code := b.shell(t, "cd /tmp && (setsid nohup python3 -m http.server 8000 >/tmp/srv.log 2>&1 &) ; for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; exit 1"); code != 0 {
		t.Fatalf("sandbox B's listener did not start: %s", out)
	}
	for _, x := range []attempt{
		{name: "sandbox-b-own-addr", what: "from A, 100.64.0.2:8000 (B's listener; A has the same address)",
			run: func(t *testing.T) (bool, string) {
				return failed(a.probe(t, "tcp", "100.64.0.2", "8000", fmt.Sprintf(httpGet, "100.64.0.2")))
			}},
		{name: "sandbox-b-via-gateway", what: "from A, 100.64.0.1:8000 (through the gateway's address)",
			run: func(t *testing.T) (bool, string) {
				return failed(a.probe(t, "tcp", "100.64.0.1", "8000", fmt.Sprintf(httpGet, "100.64.0.1")))
			}, denied: deniedTCP("100.64.0.1", 8000)},
		{name: "sandbox-b-neighbour", what: "from A, 100.65.0.2:8000 and 100.64.0.6:8000 (other addresses of the range)",
			run: func(t *testing.T) (bool, string) {
				r1 := a.probe(t, "tcp", "100.65.0.2", "8000", fmt.Sprintf(httpGet, "x"))
				r2 := a.probe(t, "tcp", "100.64.0.6", "8000", fmt.Sprintf(httpGet, "x"))
				return r1.OK || r2.OK, r1.Detail + "; " + r2.Detail
			}, denied: deniedTCP("100.64.0.6", 8000)},
	} {
		s.check(t, x)
	}
	if out, _ := b.shell(t, "curl -s http://100.64.0.2:8000/ >/dev/null && echo B-serves-itself"); !strings.Contains(out, "B-serves-itself") {
		t.Errorf("B's listener is not reachable from B itself (the case above proves nothing): %s", out)
	}

	// Proxy requests and malformed names, to the test internet's HTTP.
	long := strings.Repeat("a", 300)
	label := strings.Repeat("b", 64) + ".test.airlock"
	longName := strings.Repeat(strings.Repeat("c", 60)+".", 5) + "test.airlock"
	for _, x := range []attempt{
		{name: "http-connect", what: "CONNECT 10.0.0.1:80 sent to www.test.airlock:80",
			run: func(t *testing.T) (bool, string) {
				return failed(a.probe(t, "tcp", inet2, "80", `CONNECT 10.0.0.1:80 HTTP/1.1\r\nHost: 10.0.0.1:80\r\n\r\n`))
			},
			denied: deniedTCP(inet2, 80)},
		{name: "http-absolute-uri", what: "GET http://169.254.169.254/ (proxy form) with Host www.test.airlock",
			run: func(t *testing.T) (bool, string) {
				return failed(a.probe(t, "tcp", inet2, "80", `GET http://169.254.169.254/ HTTP/1.1\r\nHost: `+www+`\r\n\r\n`))
			},
			denied: deniedTCP(inet2, 80)},
		{name: "host-300-chars", what: "Host header of 300 characters",
			run: func(t *testing.T) (bool, string) {
				return failed(a.probe(t, "tcp", inet2, "80", fmt.Sprintf(httpGet, long)))
			},
			denied: deniedTCP(inet2, 80)},
		{name: "host-label-64", what: "Host with a 64-character label",
			run: func(t *testing.T) (bool, string) {
				return failed(a.probe(t, "tcp", inet2, "80", fmt.Sprintf(httpGet, label)))
			},
			denied: deniedTCP(inet2, 80)},
		{name: "dns-label-64", what: "DNS query for a name with a 64-character label",
			run: func(t *testing.T) (bool, string) {
				r := a.probe(t, "dns", "100.64.0.1", label, "1")
				return r.Rcode == nil || *r.Rcode == 0, r.Detail
			}},
		{name: "sni-over-255", what: "TLS ClientHello whose SNI is a 317-character name (labels of 60), to 198.18.x.2:443",
			run:    func(t *testing.T) (bool, string) { return failed(a.probe(t, "tls", inet2, "443", longName)) },
			denied: deniedTCP(inet2, 443)},
		{name: "sni-label-64", what: "TLS ClientHello whose SNI has a 64-character label (openssl s_client), to 198.18.x.2:443",
			run: func(t *testing.T) (bool, string) {
				out, rc := a.shell(t, "echo | timeout 15 openssl s_client -connect "+inet2+":443 -servername "+label+" 2>&1 | head -5")
				return strings.Contains(out, "BEGIN CERTIFICATE") || strings.Contains(out, "CONNECTED") && strings.Contains(out, "depth="), fmt.Sprintf("rc=%d: %s", rc, strings.TrimSpace(out))
			}, denied: deniedTCP(inet2, 443)},
		{name: "keepalive-host-to-private", what: "keep-alive: Host www.test.airlock, then Host 10.0.0.1 on the same connection",
			run: func(t *testing.T) (bool, string) {
				return failed(a.probe(t, "keepalive", inet2, "80", www, "10.0.0.1"))
			},
			denied: deniedRE(`host=10\.0\.0\.1 `)},
	} {
		s.check(t, x)
	}
	for _, r := range in.Requests() {
		if strings.Contains(r.Path, "forged") || strings.Contains(r.Path, "spoofed") || strings.Contains(r.Path, "front") ||
			len(r.Host) > 255 || strings.Contains(r.Host, "10.0.0.1") || strings.Contains(r.Host, "169.254") {
			t.Errorf("BYPASS: the test internet received %+v", r)
		}
	}
}
