package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlock/airlock/internal/controller"
	"github.com/airlock/airlock/internal/httplimit"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/worker"
)

// Metrics (--metrics-addr ADDR of `airlock worker` and `airlock up`, off
// when empty): Prometheus text at http://ADDR/metrics, on a listener of
// its own. Scrapers expect /metrics without credentials, and the API and
// the data plane answer nothing without a key or a token; a separate
// listener lets an operator bind it where only the scraper reaches (a
// private interface, loopback) without opening the API or the data plane
// there, and keeps scrapes off the listeners clients use.

// addMetricsFlag adds --metrics-addr to fs.
func addMetricsFlag(fs *flag.FlagSet) *string {
	return fs.String("metrics-addr", "", "serve Prometheus metrics at http://`ADDR`/metrics, a listener of its own without authentication (server: API requests, operations, sandboxes by state, pool claims, reconcile rounds and lag; worker: snapshots, data-plane bytes, egress decisions; Go and process statistics; see docs/operations.md); off when empty")
}

// metrics is the daemon's Prometheus registry.
type metrics struct {
	reg    *prometheus.Registry
	egress *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		egress: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_egress_decisions_total",
			Help: "Decisions of the worker's egress gateway, by kind (dns, tcp, http), decision (allowed, denied) and reason code (docs/network.md).",
		}, []string{"kind", "decision", "reason"}),
	}
	m.reg.MustRegister(m.egress, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every series a gateway can produce exists from the start (at 0), so
	// rates and alerts need no "absent" case.
	for _, k := range []string{model.NetKindDNS, model.NetKindTCP, model.NetKindHTTP} {
		for _, c := range []string{model.NetCodeRule, model.NetCodeDefault} {
			m.egress.WithLabelValues(k, model.NetAllowed, c)
		}
		for _, c := range model.NetCodes {
			m.egress.WithLabelValues(k, model.NetDenied, c)
		}
	}
	return m
}

// egressDecision counts one decision; the labels come from fixed sets
// (netDecision, reasonCode), never from names or addresses.
func (m *metrics) egressDecision(kind, decision, code string) {
	m.egress.WithLabelValues(kind, decision, code).Inc()
}

// serveMetrics listens on addr (at once, so that a taken port fails the
// start) and serves m's /metrics until ctx ends; "" serves nothing. It
// returns the address listened on.
func serveMetrics(ctx context.Context, addr string, m *metrics, log *slog.Logger) (string, error) {
	if addr == "" {
		return "", nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}))
	srv := httplimit.Control.Server(mux)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics listener", "addr", ln.Addr().String(), "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("serving metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return ln.Addr().String(), nil
}

// watchServer exports the server's families (a nil m does nothing):
//
//   - the controller's reconcile rounds: a histogram of their durations,
//     gauges of the last one's duration and sandboxes (what `airlock bench
//     --only scale` reads to plot reconcile time against the sandbox
//     count), sandboxes by state, open operations and the age of the
//     oldest (the reconcile lag);
//   - operations by kind and result, timed from created to done;
//   - warm-pool claims, hits and misses;
//   - native API requests by method, route and status, and their latency.
func (m *metrics) watchServer(srv *server) {
	if m == nil {
		return
	}
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "airlock_controller_reconcile_seconds",
		Help:    "Duration of the controller's full reconcile rounds (every sandbox not deleted, every open operation).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14), // 1 ms .. 8 s
	})
	last := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "airlock_controller_reconcile_last_seconds",
		Help: "Duration of the controller's last full reconcile round.",
	})
	count := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "airlock_controller_reconcile_sandboxes",
		Help: "Sandboxes the controller's last full reconcile round listed.",
	})
	byState := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "airlock_sandboxes",
		Help: "Sandboxes (not deleted) by state, as of the controller's last reconcile round.",
	}, []string{"state"})
	open := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "airlock_operations_open",
		Help: "Lifecycle operations not yet done, as of the last reconcile round.",
	})
	lag := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "airlock_reconcile_lag_seconds",
		Help: "Age of the oldest open operation at the last reconcile round: how far the installation lags behind what clients asked for (0: none open).",
	})
	ops := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "airlock_operation_duration_seconds",
		Help:    "Lifecycle operations from accepted to done, by kind (create, pause, suspend, wake, …) and result (succeeded, failed, cancelled); _count counts them.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 16), // 10 ms .. 5.5 min
	}, []string{"kind", "result"})
	pool := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "airlock_pool_claims_total",
		Help: "Creates a warm pool matched, by result: hit (a running member handed over) or miss (none ready; the sandbox boots).",
	}, []string{"result"})
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "airlock_api_requests_total",
		Help: "API requests (native and E2B) by method, route pattern and status.",
	}, []string{"method", "route", "status"})
	reqTime := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "airlock_api_request_duration_seconds",
		Help:    "API request latency (native and E2B) by method and route pattern (event streams and long polls included, as long as they stay open).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18), // 0.5 ms .. 65 s
	}, []string{"method", "route"})
	m.reg.MustRegister(hist, last, count, byState, open, lag, ops, pool, reqs, reqTime)
	for _, st := range model.SandboxStates {
		byState.WithLabelValues(string(st))
	}
	pool.WithLabelValues("hit")
	pool.WithLabelValues("miss")
	srv.ctrl.ObserveRounds(func(rs controller.RoundStats) {
		hist.Observe(rs.Duration.Seconds())
		last.Set(rs.Duration.Seconds())
		count.Set(float64(rs.Sandboxes))
		for _, st := range model.SandboxStates {
			byState.WithLabelValues(string(st)).Set(float64(rs.ByState[st]))
		}
		open.Set(float64(rs.OpenOperations))
		lag.Set(rs.OldestOpen.Seconds())
	})
	var seen opSeen
	srv.cfg.Events.ObserveOperations(func(op model.Operation) {
		if op.State.Done() && seen.first(op.ID) {
			ops.WithLabelValues(string(op.Kind), string(op.State)).Observe(max(0, op.UpdatedAt.Sub(op.CreatedAt).Seconds()))
		}
	})
	srv.svc.ObservePoolClaims(func(hit bool) {
		if hit {
			pool.WithLabelValues("hit").Inc()
		} else {
			pool.WithLabelValues("miss").Inc()
		}
	})
	f := func(method, route string, status int, d time.Duration) {
		reqs.WithLabelValues(method, route, strconv.Itoa(status)).Inc()
		reqTime.WithLabelValues(method, route).Observe(d.Seconds())
	}
	srv.observeAPI.Store(&f)
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "airlock_controller_leader",
		Help: "1 when this server's controller holds the controller lease (it reconciles), 0 when another replica does.",
	}, func() float64 {
		if leading, _ := srv.ctrl.Leading(); leading {
			return 1
		}
		return 0
	}))
}

// opSeen remembers the operations already timed, so an operation whose
// final state is recorded twice counts once. It forgets everything past
// a bound (an operation's final state is recorded within moments).
type opSeen struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

func (s *opSeen) first(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ids[id]; ok {
		return false
	}
	if s.ids == nil || len(s.ids) >= 4096 {
		s.ids = make(map[string]struct{})
	}
	s.ids[id] = struct{}{}
	return true
}

// workerObserver returns the worker's Observer over m's families of
// snapshots and data-plane bytes (nil for a nil m: no --metrics-addr).
func (m *metrics) workerObserver() worker.Observer {
	if m == nil {
		return nil
	}
	o := &workerMetrics{
		snapBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_snapshot_bytes_total",
			Help: "Bytes of the snapshots the worker wrote, by kind (suspend, checkpoint).",
		}, []string{"kind"}),
		snapTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "airlock_snapshot_duration_seconds",
			Help:    "Snapshots written (kind suspend, checkpoint) and restored (kind restore, a wake) by the worker, by result (ok, error).",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14), // 50 ms .. 7 min
		}, []string{"kind", "result"}),
		dataPlane: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_dataplane_bytes_total",
			Help: "Bytes the worker's data plane moved, by kind (command, file) and direction (out: command output and file reads to clients; in: stdin and file writes).",
		}, []string{"kind", "direction"}),
	}
	m.reg.MustRegister(o.snapBytes, o.snapTime, o.dataPlane)
	for _, k := range []string{"command", "file"} {
		o.dataPlane.WithLabelValues(k, "in")
		o.dataPlane.WithLabelValues(k, "out")
	}
	return o
}

type workerMetrics struct {
	snapBytes *prometheus.CounterVec
	snapTime  *prometheus.HistogramVec
	dataPlane *prometheus.CounterVec
}

func (o *workerMetrics) Snapshot(kind string, bytes int64, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	} else if bytes > 0 {
		o.snapBytes.WithLabelValues(kind).Add(float64(bytes))
	}
	o.snapTime.WithLabelValues(kind, result).Observe(d.Seconds())
}

func (o *workerMetrics) DataPlane(kind, direction string, bytes int64) {
	if bytes > 0 {
		o.dataPlane.WithLabelValues(kind, direction).Add(float64(bytes))
	}
}

// startMetrics makes the registry and serves it on addr; nil and no
// listener when addr is "".
func startMetrics(ctx context.Context, addr string, log *slog.Logger) (*metrics, error) {
	if addr == "" {
		return nil, nil
	}
	m := newMetrics()
	if _, err := serveMetrics(ctx, addr, m, log); err != nil {
		return nil, err
	}
	return m, nil
}
