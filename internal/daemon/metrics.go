package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlock/airlock/internal/controller"
	"github.com/airlock/airlock/internal/httplimit"
	"github.com/airlock/airlock/internal/model"
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
	return fs.String("metrics-addr", "", "serve Prometheus metrics at http://`ADDR`/metrics, a listener of its own without authentication (egress decisions by kind, decision and reason; the controller's reconcile rounds; Go and process statistics); off when empty")
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

// watchController exports ctrl's reconcile rounds: a histogram of their
// durations, and gauges of the last one's duration and sandboxes (what
// `airlock bench --only scale` reads to plot reconcile time against the
// sandbox count). A nil m does nothing.
func (m *metrics) watchController(ctrl *controller.Controller) {
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
	m.reg.MustRegister(hist, last, count)
	ctrl.ObserveRounds(func(d time.Duration, n int) {
		hist.Observe(d.Seconds())
		last.Set(d.Seconds())
		count.Set(float64(n))
	})
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
