package egressbench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/airlock/airlock/internal/bench"
	"github.com/airlock/airlock/internal/egress/testinet"
	"github.com/airlock/airlock/internal/network"
)

// The user path: curl, the tool an agent runs, from a plain namespace
// (the direct one) against curl from inside a real gVisor sandbox (runsc
// --network=sandbox in the guest namespace, the way the gvisor driver
// runs a sandbox with an egress network) through the gateway, and against
// curl in the guest namespace without gVisor (the gateway's share alone).
// curl times its own transfers (-w %{time_total}); one curl fetches a
// batch of URLs, each on a new connection (Connection: close, no TLS
// session reuse), and batches alternate between the paths; each batch's
// first transfer is not counted.

// curlBatches is how many batches each path's requests are split into.
const curlBatches = 4

type curlCase struct {
	name, desc string
	scheme     string
	port       uint16
	gvisor     bool // the gateway side runs in a gVisor sandbox
}

func curlCases() []curlCase {
	www := testinet.Name(testinet.WWW)
	return []curlCase{
		{name: "curl_http_get_netns", desc: "curl http://" + www + "/ (new connection each) from the guest namespace through the gateway, no gVisor, vs curl from the direct namespace; curl's own time_total (ms)", scheme: "http", port: 80},
		{name: "curl_http_get_gvisor", desc: "curl http://" + www + "/ (new connection each) from inside a gVisor sandbox (runsc --network=sandbox in the guest namespace: gVisor's netstack, then the gateway) vs curl from the direct namespace; curl's own time_total (ms)", scheme: "http", port: 80, gvisor: true},
		{name: "curl_https_get_gvisor", desc: "curl https://" + www + "/ (new connection and full handshake each) from inside a gVisor sandbox through the gateway vs curl from the direct namespace; curl's own time_total (ms)", scheme: "https", port: 443, gvisor: true},
	}
}

// curlArgs fetches the case's URL n times, printing each transfer's time.
func (e *env) curlArgs(c curlCase, n int) []string {
	www := testinet.Name(testinet.WWW)
	url := fmt.Sprintf("%s://%s/", c.scheme, www)
	args := []string{"curl", "-sS", "--fail", "--no-sessionid", "--max-time", "30",
		"-H", "Connection: close", "--cacert", e.in.CAFile,
		"--resolve", fmt.Sprintf("%s:%d:%s", www, c.port, e.in.Addr(wwwAddr)),
		"-w", "%{time_total}\\n"}
	for range n {
		args = append(args, "-o", "/dev/null", url)
	}
	return args
}

// measureCurl runs one curl case on both paths.
func (e *env) measureCurl(ctx context.Context, c curlCase) bench.EgressCase {
	out := bench.EgressCase{Name: c.name, Description: c.desc, Rule: "rule 0 (domains)"}
	curl, err := exec.LookPath("curl")
	if err != nil {
		out.Skipped = "curl is not installed"
		return out
	}
	if c.gvisor && e.cfg.Runsc == "" {
		out.Skipped = "no runsc: " + e.cfg.RunscWhy
		return out
	}
	n := max(1, e.cfg.Requests/curlBatches)
	var samples [2][]float64
	for b := range curlBatches + 1 { // batch 0 on each path is a warm-up
		order := [2]int{0, 1}
		if b%2 == 1 {
			order = [2]int{1, 0}
		}
		for _, i := range order {
			k := n + 1
			if b == 0 {
				k = warmup
			}
			var ts []float64
			var err error
			switch {
			case i == 0:
				ts, err = e.curlIn(ctx, e.direct, curl, e.curlArgs(c, k), k)
			case c.gvisor:
				ts, err = e.curlGVisor(ctx, e.curlArgs(c, k), k)
			default:
				if err = e.fresh(ctx, testinet.Name(testinet.WWW), true); err == nil {
					ts, err = e.curlIn(ctx, e.guest, curl, e.curlArgs(c, k), k)
				}
			}
			if err != nil {
				out.Error = fmt.Sprintf("%s: %v", [2]string{"direct", "gateway"}[i], err)
				return out
			}
			if b > 0 {
				// The first transfer of a batch is dropped on both paths:
				// in a fresh sandbox it also pays ARP and the netstack's
				// warm-up, which is a sandbox's start, not its egress.
				samples[i] = append(samples[i], ts[1:]...)
			}
		}
	}
	d, g := bench.Summarize("ms", samples[0]), bench.Summarize("ms", samples[1])
	out.Direct, out.Gateway = &d, &g
	e.progress("%s: direct p50 %.3f ms, gateway p50 %.3f ms", c.name, d.P50, g.P50)
	return out
}

// curlIn runs curl as a child forked on the namespace's thread (a child
// inherits the network namespace of the thread that forks it).
func (e *env) curlIn(ctx context.Context, t *nsThread, curl string, args []string, n int) ([]float64, error) {
	cmd := exec.CommandContext(ctx, curl, args[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	var startErr error
	t.run(func() { startErr = cmd.Start() })
	if startErr != nil {
		return nil, startErr
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("curl: %v: %s", err, lastLine(stderr.String()))
	}
	return parseTimes(stdout.String(), n)
}

// curlGVisor runs curl in a one-shot gVisor sandbox whose network is the
// guest namespace, as the gvisor driver runs a sandbox with an egress
// network (--network=sandbox, the namespace named in the OCI spec): the
// host's root filesystem read-only under a memory overlay (as `runsc
// do`), no capabilities.
func (e *env) curlGVisor(ctx context.Context, args []string, n int) ([]float64, error) {
	// runsc moves eth0's address and route into its netstack: they are put
	// back before each start and after it (the Go client needs them).
	if err := network.PrepareAt(e.netw); err != nil {
		return nil, err
	}
	defer func() {
		if err := network.PrepareAt(e.netw); err != nil {
			e.progress("after runsc: %v", err)
		}
	}()
	if err := e.fresh(ctx, testinet.Name(testinet.WWW), true); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "airlock-bench-curl-")
	if err != nil {
		return nil, err
	}
	bundle, state := filepath.Join(dir, "bundle"), filepath.Join(dir, "state")
	defer func() {
		if err := errors.Join(bench.RemoveRunscRoot(state), os.RemoveAll(dir)); err != nil {
			e.progress("cleanup: %v", err)
		}
	}()
	for _, d := range []string{bundle, state} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
	}
	type m = map[string]any
	spec := m{
		"ociVersion": "1.0.2",
		"process": m{"user": m{"uid": 0, "gid": 0}, "args": args, "cwd": "/",
			"env": []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root"}},
		"root":     m{"path": "/", "readonly": true},
		"hostname": "bench",
		"mounts": []m{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		},
		"linux": m{"namespaces": []m{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network", "path": e.netw.Namespace}}},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return nil, err
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	cid := "bench-curl-" + hex.EncodeToString(rnd[:])
	base := []string{"--root", state, "--platform=systrap"}
	run := append(append([]string(nil), base...), "--network=sandbox", "--overlay2=root:memory", "run", "--bundle", bundle, cid)
	cmd := exec.CommandContext(ctx, e.cfg.Runsc, run...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	// Nothing outlives the run (a sandbox whose curl exited is gone;
	// this removes one left by an error).
	_ = exec.Command(e.cfg.Runsc, append(base, "delete", "--force", cid)...).Run()
	if err != nil {
		return nil, fmt.Errorf("runsc run curl: %v: %s", err, lastLine(stderr.String()))
	}
	return parseTimes(stdout.String(), n)
}

// parseTimes reads curl's -w '%{time_total}\n' lines (seconds) as ms.
func parseTimes(out string, n int) ([]float64, error) {
	var ts []float64
	for _, l := range strings.Fields(out) {
		v, err := strconv.ParseFloat(l, 64)
		if err != nil {
			return nil, fmt.Errorf("curl printed %q, not a time", l)
		}
		ts = append(ts, v*1000)
	}
	if len(ts) != n {
		return nil, fmt.Errorf("curl printed %d times for %d requests", len(ts), n)
	}
	return ts, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}
