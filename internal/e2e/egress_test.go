package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock/airlock/client"
	"github.com/airlock/airlock/internal/egress/egresstest"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
	"github.com/airlock/airlock/internal/testenv"
)

// egressUp starts `airlock up --egress` whose gateway resolves through the
// test internet's DNS, under profile, with runtime rt (gvisor: QEMU off;
// qemu: QEMU on, sharing the stack's QEMU assets and template images), and
// returns its admin client and log path. The instance is stopped when t
// ends, after the sandboxes created later are deleted (cleanups run last
// first).
func egressUp(t *testing.T, s *stack, in *egresstest.Internet, profile, rt string, extra ...string) (*client.Client, string) {
	t.Helper()
	u := newUp(t, s, "http")
	args := []string{"--template-images", "", "--egress", "--egress-resolver", in.DNS.String(), "--egress-profile", profile}
	args = append(args, extra...) // a flag given again wins
	if rt == "qemu" {
		for _, d := range []string{"qemu", "images"} {
			if err := os.MkdirAll(filepath.Join(s.workerDir, d), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(s.workerDir, d), filepath.Join(u.dir, d)); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		args = append(args, "--qemu=false")
	}
	up := u.start(t, s, http.DefaultClient, args...)
	t.Cleanup(func() { kill(up, syscall.SIGTERM) })
	return client.New(u.url, u.adminKey()), u.logPath
}

// egressSandbox creates a sandbox of runtime rt and checks, when t ends,
// that its namespaces went with it.
func egressSandbox(t *testing.T, c *client.Client, rt string) string {
	t.Helper()
	var id string
	t.Cleanup(func() { // registered first, so it runs after the sandbox's delete
		if id == "" {
			return
		}
		for _, p := range []string{network.Path(id), network.GatewayPath(id)} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("namespace %s left behind after delete", p)
			}
		}
	})
	if rt == "qemu" {
		id = newQEMUSandbox(t, c)
	} else {
		id = newSandbox(t, c, client.CreateSandboxRequest{}).ID
	}
	if !network.HasGateway(id) {
		t.Fatalf("sandbox %s has no gateway namespace: is --egress on?", id)
	}
	return id
}

// newQEMUSandbox creates a qemu sandbox, allowing for the runtime's
// background set-up in a fresh `airlock up` (the guest initramfs for this
// build's agent, the template's image), and deletes it when t ends.
func newQEMUSandbox(t *testing.T, c *client.Client) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	t0 := time.Now()
	sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: "qemu"}, "")
	if err != nil {
		t.Fatalf("create a qemu sandbox: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if op, err := c.DeleteSandbox(ctx, sb.ID); err == nil {
			c.WaitOperation(ctx, op.ID)
		}
	})
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatalf("qemu sandbox did not start: %v", err)
	}
	t.Logf("qemu sandbox %s running after %v", sb.ID, time.Since(t0).Round(time.Millisecond))
	return sb.ID
}

// upLifecycle runs a suspend or wake of sandbox id to its end.
func upLifecycle(t *testing.T, c *client.Client, id string, call func(context.Context, string) (model.Operation, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	op, err := call(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatalf("operation %s: %v", op.Kind, err)
	}
}

// egressLog is the "egress denied" lines of an airlock up log.
func egressLog(path string) string {
	b, _ := os.ReadFile(path)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "egress denied") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// putFile writes content to path in the sandbox.
func putFile(t *testing.T, c *client.Client, id, path, content string) {
	t.Helper()
	r := sh(t, c, id, fmt.Sprintf("cat > %s <<'AIRLOCK_EOF'\n%sAIRLOCK_EOF\n", path, content))
	if r.exit.ExitCode != 0 {
		t.Fatalf("write %s: %d %s", path, r.exit.ExitCode, r.stderr)
	}
}

// timed runs script in the sandbox and appends "rc=<exit> ms=<elapsed>"
// measured in the guest, on its uptime clock (a VM's wall clock may be
// stepped to the host's while the script runs).
func timed(t *testing.T, c *client.Client, id, script string) (out string, rc, ms int) {
	t.Helper()
	r := sh(t, c, id, "t0=$(cut -d' ' -f1 /proc/uptime); { "+script+" ; } 2>&1; rc=$?; t1=$(cut -d' ' -f1 /proc/uptime); "+
		"echo; echo rc=$rc ms=$(echo $t0 $t1 | awk '{print int(($2-$1)*1000)}')")
	m := regexp.MustCompile(`rc=(\d+) ms=(\d+)\s*$`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("%s: no rc line in %q (stderr %q)", script, r.stdout, r.stderr)
	}
	fmt.Sscan(m[1], &rc)
	fmt.Sscan(m[2], &ms)
	return strings.TrimSpace(r.stdout[:len(r.stdout)-len(m[0])]), rc, ms
}

// dnsQueryPy asks one DNS question (argv: server, name, qtype number)
// over UDP and prints "rcode=<n> answers=<n> ips=<a,b>".
const dnsQueryPy = `
import random, socket, struct, sys
server, name, qtype = sys.argv[1], sys.argv[2], int(sys.argv[3])
qid = random.randrange(65536)
q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
for l in name.rstrip(".").split("."):
    q += bytes([len(l)]) + l.encode()
q += b"\0" + struct.pack(">HH", qtype, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(q, (server, 53))
try:
    r, src = s.recvfrom(4096)
except socket.timeout:
    print("timeout"); sys.exit(3)
rid, flags, qd, an, ns, ar = struct.unpack(">HHHHHH", r[:12])
i = 12
for _ in range(qd):
    while r[i]: i += r[i] + 1
    i += 5
ips = []
for _ in range(an):
    if r[i] & 0xc0 == 0xc0: i += 2
    else:
        while r[i]: i += r[i] + 1
        i += 1
    t, c, ttl, l = struct.unpack(">HHIH", r[i:i+10]); i += 10
    if t == 1: ips.append(socket.inet_ntoa(r[i:i+4]))
    i += l
print("from=%s id_ok=%s rcode=%d answers=%d ips=%s" % (src[0], rid == qid, flags & 0xf, an, ",".join(ips)))
`

// TestEgressFunctional: under `airlock up --egress --egress-profile
// public` whose gateway resolves through a test internet (internal/
// egress/egresstest), a gVisor sandbox names the gateway as its resolver,
// reaches allowed names with curl, python3 urllib and git clone over HTTP
// and HTTPS (TLS passed through, the test CA given to the guest), cannot
// use a name that resolves to a private address (rebinding), and gets a
// reset for private and metadata addresses; under --egress-profile none
// every name is REFUSED and every connection reset.
func TestEgressFunctional(t *testing.T) { egressFunctional(t, "gvisor") }

// TestEgressFunctionalQEMU is TestEgressFunctional with a QEMU sandbox
// (TCG on these machines): its tap is bridged to the same gateway path,
// and the guest configured its address and resolver at boot. It also
// suspends and wakes the sandbox and reaches the test internet again.
func TestEgressFunctionalQEMU(t *testing.T) {
	testenv.RequireQEMU(t)
	egressFunctional(t, "qemu")
}

func egressFunctional(t *testing.T, rt string) {
	s := need(t)
	in := egresstest.Start(t, egresstest.Config{})
	t.Logf("test internet %s: %s, DNS %s", in.Netns, in.Prefix, in.DNS)

	t.Run("public", func(t *testing.T) {
		c, logPath := egressUp(t, s, in, "public", rt)
		id := egressSandbox(t, c, rt)
		putFile(t, c, id, "/tmp/ca.pem", string(in.CAPEM))
		www := egresstest.Name(egresstest.WWW)
		wwwIP := in.Addr(2).String()

		if r := sh(t, c, id, "cat /etc/resolv.conf"); !regexp.MustCompile(`(?m)^nameserver 100\.64\.0\.1$`).MatchString(r.stdout) {
			t.Errorf("/etc/resolv.conf does not name the gateway 100.64.0.1:\n%s", r.stdout)
		}

		want := func(what, out string, wantSub ...string) {
			t.Helper()
			for _, w := range wantSub {
				if !strings.Contains(out, w) {
					t.Errorf("%s: output lacks %q:\n%s", what, w, out)
				}
			}
		}
		// curl, http and https.
		out, rc, ms := timed(t, c, id, "curl -sS -m 20 http://"+www+"/curl")
		t.Logf("curl http: rc=%d in %d ms: %s", rc, ms, out)
		want("curl http", out, "airlock-inet addr="+wwwIP+" host="+www+" ", "path=/curl")
		out, rc, ms = timed(t, c, id, "curl -sS -m 20 --cacert /tmp/ca.pem https://"+www+"/curls")
		t.Logf("curl https: rc=%d in %d ms: %s", rc, ms, out)
		want("curl https", out, "airlock-inet addr="+wwwIP+" host="+www+" sni="+www+" path=/curls")

		// python3 urllib, the CA through SSL_CERT_FILE.
		py := "import sys, urllib.request\nfor u in sys.argv[1:]: print(urllib.request.urlopen(u, timeout=20).read().decode().strip())"
		r := run(t, c, id, client.CreateCommandRequest{
			Argv: []string{"python3", "-c", py, "http://" + www + "/py", "https://" + www + "/pys"},
			Env:  map[string]string{"SSL_CERT_FILE": "/tmp/ca.pem"},
		}, nil)
		t.Logf("python3 urllib: exit %d: %s %s", r.exit.ExitCode, r.stdout, r.stderr)
		want("python3 urllib", r.stdout, "host="+www+" sni= path=/py\n", "host="+www+" sni="+www+" path=/pys")

		// git clone over dumb HTTP, both schemes.
		if in.GitRepo == "" {
			t.Logf("SKIPPED git clone: %s", in.GitReason)
		} else {
			for _, scheme := range []string{"http", "https"} {
				dst := "/tmp/clone-" + scheme
				out, rc, ms := timed(t, c, id, "GIT_SSL_CAINFO=/tmp/ca.pem git clone -q "+scheme+"://"+www+in.GitRepo+" "+dst+" && git -C "+dst+" rev-parse HEAD")
				t.Logf("git clone %s: rc=%d in %d ms: %s", scheme, rc, ms, out)
				if rc != 0 || !strings.Contains(out, in.GitHead) {
					t.Errorf("git clone over %s: rc=%d, want HEAD %s:\n%s", scheme, rc, in.GitHead, out)
				}
			}
		}

		// Rebinding: an allowed (public profile: every) name that resolves
		// to a private address. The gateway's DNS leaves the address out
		// of the answer (REFUSED: nothing is left), so the name does not
		// resolve; a connection to the address itself is reset (below).
		out, rc, ms = timed(t, c, id, "getent ahostsv4 "+egresstest.Name(egresstest.Rebind)+" | head -1; curl -sS -m 20 http://"+egresstest.Name(egresstest.Rebind)+"/rebind")
		t.Logf("rebinding (%s → 10.0.0.1): rc=%d after %d ms: %s", egresstest.Name(egresstest.Rebind), rc, ms, out)
		if rc == 0 || rc == 28 {
			t.Errorf("rebinding: curl rc=%d (want a refused or reset connection, not success or a timeout):\n%s", rc, out)
		}

		// Raw private and metadata addresses: reset at once.
		for _, dst := range []string{"10.0.0.1", "169.254.169.254", "192.168.1.1", "127.0.0.1"} {
			out, rc, ms := timed(t, c, id, "curl -sS -m 20 http://"+dst+"/raw")
			t.Logf("raw %s: rc=%d after %d ms: %s", dst, rc, ms, out)
			if rc == 0 || rc == 28 {
				t.Errorf("raw connect to %s: curl rc=%d (want a reset or refused connection):\n%s", dst, rc, out)
			}
		}
		for _, r := range in.Requests() {
			if strings.Contains(r.Path, "raw") || strings.Contains(r.Path, "rebind") {
				t.Errorf("the test internet received a denied request: %+v", r)
			}
		}
		denied := egressLog(logPath)
		for _, ip := range []string{"10.0.0.1", "169.254.169.254", "192.168.1.1"} {
			if !regexp.MustCompile(`ip=` + regexp.QuoteMeta(ip) + ` `).MatchString(denied) {
				t.Errorf("no 'egress denied' line for %s in the log of airlock up; denied lines:\n%s", ip, denied)
			}
		}

		if rt == "qemu" {
			// Suspend and wake: the guest's memory keeps its address,
			// route, MAC and ARP cache; the worker makes the same link
			// and gateway listeners again, so it reaches the network at
			// once (a stale link would time out here).
			upLifecycle(t, c, id, c.SuspendSandbox)
			upLifecycle(t, c, id, c.WakeSandbox)
			out, rc, ms := timed(t, c, id, "curl -sS -m 20 http://"+www+"/woken")
			t.Logf("curl http after suspend and wake: rc=%d in %d ms: %s", rc, ms, out)
			want("curl http after wake", out, "airlock-inet addr="+wwwIP+" host="+www+" ", "path=/woken")
		}
	})

	if rt == "qemu" {
		// QEMU's default: creates restore a template image (a VM booted
		// and checkpointed once). The image is built on the egress
		// network, so a sandbox restored from it has its link at once.
		t.Run("template-image", func(t *testing.T) {
			c, logPath := egressUp(t, s, in, "public", rt, "--template-images", "qemu")
			egressSandbox(t, c, rt) // boots; the image is built in the background
			deadline := time.Now().Add(10 * time.Minute)
			for {
				b, _ := os.ReadFile(logPath)
				if strings.Contains(string(b), "template image built") {
					break
				}
				if strings.Contains(string(b), "template image not built") || time.Now().After(deadline) {
					t.Fatalf("no template image:\n%s", b)
				}
				time.Sleep(500 * time.Millisecond)
			}
			id := egressSandbox(t, c, rt)
			www := egresstest.Name(egresstest.WWW)
			out, rc, ms := timed(t, c, id, "cat /etc/resolv.conf; curl -sS -m 20 http://"+www+"/from-image")
			t.Logf("curl http from a sandbox restored from the template image: rc=%d in %d ms: %s", rc, ms, out)
			if rc != 0 || !strings.Contains(out, "nameserver 100.64.0.1") || !strings.Contains(out, "path=/from-image") {
				t.Errorf("a sandbox restored from the template image has no working egress:\n%s", out)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if sb, err := c.GetSandbox(ctx, id); err != nil || sb.StartedFrom != model.StartedTemplateImage {
				b, _ := os.ReadFile(logPath)
				t.Errorf("sandbox started from %q (%v), want the template image:\n%s", sb.StartedFrom, err, b)
			}
		})
	}

	t.Run("none", func(t *testing.T) {
		c, logPath := egressUp(t, s, in, "none", rt)
		id := egressSandbox(t, c, rt)
		putFile(t, c, id, "/tmp/dnsq.py", dnsQueryPy)
		www := egresstest.Name(egresstest.WWW)
		out, rc, ms := timed(t, c, id, "python3 /tmp/dnsq.py 100.64.0.1 "+www+" 1")
		t.Logf("DNS A %s under none: rc=%d after %d ms: %s", www, rc, ms, out)
		if !strings.Contains(out, "rcode=5 ") {
			t.Errorf("DNS under profile none: want REFUSED (rcode=5):\n%s", out)
		}
		out, rc, ms = timed(t, c, id, "curl -sS -m 20 http://"+in.Addr(2).String()+"/none")
		t.Logf("TCP to %s under none: rc=%d after %d ms: %s", in.Addr(2), rc, ms, out)
		if rc == 0 || rc == 28 {
			t.Errorf("TCP under profile none: curl rc=%d, want a reset:\n%s", rc, out)
		}
		for _, r := range in.Requests() {
			if r.Path == "/none" {
				t.Errorf("the test internet received a request under profile none: %+v", r)
			}
		}
		denied := egressLog(logPath)
		t.Logf("denied:\n%s", denied)
		if !strings.Contains(denied, "kind=dns name="+www+".") && !strings.Contains(denied, "name="+www+" ") {
			t.Errorf("no 'egress denied' line for the DNS query of %s; denied lines:\n%s", www, denied)
		}
		if !strings.Contains(denied, "ip="+in.Addr(2).String()+" ") {
			t.Errorf("no 'egress denied' line for the connection to %s; denied lines:\n%s", in.Addr(2), denied)
		}
	})
}
