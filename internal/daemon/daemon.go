// Package daemon runs Airlock's long-lived processes from one user-facing
// configuration: `airlock up` (a server and one worker in one process over
// embedded SQLite, doing its own first-run set-up), `airlock server` (the
// stateless control plane over SQLite or PostgreSQL) and `airlock worker`
// (one per host: runtime, data plane). In `up` the worker still talks to the
// server through the worker API over loopback HTTP, exactly as a separate
// worker does, so both deployments exercise one code path.
package daemon

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"debug/elf"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/airlock/airlock/internal/api"
	"github.com/airlock/airlock/internal/blob"
	"github.com/airlock/airlock/internal/controller"
	"github.com/airlock/airlock/internal/e2bcompat"
	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/httplimit"
	"github.com/airlock/airlock/internal/image"
	"github.com/airlock/airlock/internal/image/build"
	"github.com/airlock/airlock/internal/image/oci"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/network"
	airruntime "github.com/airlock/airlock/internal/runtime"
	"github.com/airlock/airlock/internal/runtime/gvisor"
	"github.com/airlock/airlock/internal/runtime/qemu"
	"github.com/airlock/airlock/internal/scheduler"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/setup"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/store/postgres"
	"github.com/airlock/airlock/internal/store/sqlite"
	"github.com/airlock/airlock/internal/store/sqlstore"
	"github.com/airlock/airlock/internal/tracing"
	"github.com/airlock/airlock/internal/ui"
	"github.com/airlock/airlock/internal/worker"
	"github.com/airlock/airlock/internal/workerapi"

	"go.opentelemetry.io/otel/trace"
)

// Main runs the daemon subcommand name ("up", "server" or "worker") with its
// arguments and returns the process exit code.
func Main(ctx context.Context, name string, args []string) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch name {
	case "up":
		err = up(ctx, args)
	case "server":
		err = serverCmd(ctx, args)
	case "worker":
		err = workerCmd(ctx, args)
	default:
		err = fmt.Errorf("unknown daemon command %q", name)
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock %s: %v\n", name, err)
		return 1
	}
	return 0
}

// DefaultDataDir is where `airlock up` keeps its state unless told otherwise.
func DefaultDataDir() string {
	if d := os.Getenv("AIRLOCK_DATA_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = "/root"
	}
	return filepath.Join(home, ".local", "share", "airlock")
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	// Records logged with a traced context carry its trace_id.
	return slog.New(tracing.LogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})))
}

func up(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("airlock up", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7070", "address of the API (control plane)")
	dataListen := fs.String("data-listen", "", "address of the worker's data plane (default: the API's port + 1, or any free port if that is taken)")
	dataDir := fs.String("data-dir", DefaultDataDir(), "directory for the database, runsc, templates, sandboxes and keys")
	withQEMU := fs.Bool("qemu", true, "also offer the qemu microVM runtime (set up in the background on first start)")
	images := fs.String("template-images", DefaultTemplateImages, templateImagesUsage)
	shipped := fs.String("build-templates", defaultShipped, shippedUsage)
	capf := addCapacityFlags(fs)
	deadline := fs.Duration("operation-deadline", 0, "how long a lifecycle operation may take (0: 30m)")
	e2bDomain := fs.String("e2b-domain", os.Getenv("AIRLOCK_E2B_DOMAIN"), "sandbox domain E2B answers name, for <port>-<id>.<domain> hosts behind wildcard DNS (or $AIRLOCK_E2B_DOMAIN; default: the host a request came to)")
	quotas := addQuotaFlags(fs)
	eg := addEgressFlags(fs)
	metricsAddr := addMetricsFlag(fs)
	otlp := addTraceFlag(fs)
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	var warm warmFlag
	fs.Var(&warm, "warm", warmUsage)
	tlsf := addTLSFlags(fs, "the API and the data plane")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tlsCfg, err := tlsf.serverConfig()
	if err != nil {
		return err
	}
	capacity, err := capf.resolve()
	if err != nil {
		return err
	}
	if err := tlsf.trust(); err != nil {
		return err
	}
	log := newLogger(*logLevel)
	serverTP, err := startTracing(ctx, tracing.ServiceServer, *otlp, log)
	if err != nil {
		return err
	}
	workerTP, err := startTracing(ctx, tracing.ServiceWorker, *otlp, log)
	if err != nil {
		return err
	}
	defer tracing.ShutdownAll(serverTP, workerTP)
	progress := progressWriter{}
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	fmt.Fprintf(progress, "setting up in %s\n", *dataDir)
	wt, err := secretFile(filepath.Join(*dataDir, "worker.token"))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another airlock running? use --listen)", *listen, err)
	}
	tcpAddr := ln.Addr()
	ln, scheme := listenTLS(ln, tlsCfg)
	now := time.Now // the one clock of the store, the controller and the service
	st, err := sqlite.Open(ctx, filepath.Join(*dataDir, "airlock.db"), sqlstore.WithClock(now))
	if err != nil {
		ln.Close()
		return fmt.Errorf("open database: %w", err)
	}
	defer st.Close()
	// Until this process's worker has registered, /healthz says so: a worker
	// row left by the previous run may look alive but has a stale address.
	var workerUp atomic.Bool
	var workerHTTP *http.Client
	if tlsCfg != nil {
		// The worker and the server's data-plane calls reach this very
		// process: they accept exactly its certificate, whatever names it
		// carries.
		workerHTTP = pinnedClient(tlsCfg)
	}
	srv, err := newServer(ctx, st, wt, *deadline, log, now, serverTP.TracerProvider(), controllerInstance(*listen), quotas.apply, func(c *service.Config) {
		ready := c.Ready // the controller's
		c.Ready = func(ctx context.Context) error {
			if !workerUp.Load() {
				return model.Errorf(model.ErrUnavailable, "the local worker is starting")
			}
			return ready(ctx)
		}
		if workerHTTP != nil {
			svcClient := *workerHTTP
			svcClient.Timeout = 30 * time.Second // as the service's default client
			// Archive transfers use the same transport without the timeout.
			c.DataPlane = &workerapi.DataPlane{HTTP: &svcClient}
		}
	})
	if err != nil {
		ln.Close()
		return err
	}
	srv.e2b.SetDomain(*e2bDomain)
	url := scheme + "://" + ln.Addr().String()
	errc := make(chan error, 2)
	go func() { errc <- srv.serve(ctx, ln) }()

	if err := ensureAdminKey(ctx, srv.svc, *dataDir, progress); err != nil {
		return err
	}
	if err := eg.applyDefaultProfile(ctx, srv.svc); err != nil {
		return err
	}
	workerID, err := persistentID(filepath.Join(*dataDir, "worker.id"))
	if err != nil {
		return err
	}
	if *dataListen == "" {
		*dataListen = nextPort(tcpAddr)
	}
	started := time.Now()
	wo := workerOptions{
		dataDir: *dataDir, serverURL: url, token: wt, dataListen: *dataListen,
		id: workerID, log: log, progress: progress, qemu: *withQEMU, templateImages: runtimeSet(*images),
		tls: tlsCfg, egress: eg, shipped: runtimeSet(*shipped), capacity: capacity,
		tracer: workerTP.TracerProvider(),
	}
	if wo.metrics, err = startMetrics(ctx, *metricsAddr, log); err != nil {
		return err
	}
	wo.metrics.watchServer(srv)
	wo.httpClient = workerHTTP
	w, err := newWorker(ctx, wo)
	if err != nil {
		return err
	}
	srv.setLocalWorker(workerID, w.Handler())
	go func() { errc <- w.Run(ctx) }()
	if err := waitReady(ctx, srv.ctrl, st, workerID, started, errc); err != nil {
		return err
	}
	workerUp.Store(true)
	if err := applyWarm(ctx, srv.svc, warm, 0, log); err != nil {
		return err
	}
	fmt.Fprintf(progress, "ready: %s (admin key in %s)\n", url, filepath.Join(*dataDir, "admin.key"))
	// stdout names where things are, never the key itself: the CLI reads
	// <AIRLOCK_DATA_DIR>/admin.key, and whatever captures this output (a
	// terminal's scroll-back, a service log) holds no secret.
	fmt.Printf("AIRLOCK_URL=%s\nAIRLOCK_DATA_DIR=%s\n", url, *dataDir)
	select {
	case <-ctx.Done():
		// The worker's Run returns once its actions are done (a build
		// step's sandbox and overlay released): exiting before would
		// leave them behind.
		select {
		case <-errc:
		case <-time.After(workerStopWait):
			log.Warn("the worker did not stop in time; exiting anyway", "waited", workerStopWait)
		}
		return nil
	case err := <-errc:
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
}

// workerStopWait bounds how long `airlock up` waits for its worker to
// stop after a signal.
const workerStopWait = 15 * time.Second

func serverCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("airlock server", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7070", "address of the API and the worker API")
	dataDir := fs.String("data-dir", DefaultDataDir(), "directory for the SQLite database and admin.key")
	db := fs.String("db", "", "database: a postgres:// URL, or a SQLite file path (default <data-dir>/airlock.db)")
	workerToken := fs.String("worker-token", os.Getenv("AIRLOCK_WORKER_TOKEN"), "join token workers register with (or $AIRLOCK_WORKER_TOKEN); prefer --worker-token-file: a command line is visible in ps")
	workerTokenFile := fs.String("worker-token-file", "", "`file` holding the join token workers register with")
	rotate := fs.Bool("rotate-signing-key", false, "at start, make a fresh data-plane signing key current; the previous one stays valid for --signing-key-grace (every server and worker follows within a sync)")
	grace := fs.Duration("signing-key-grace", controller.DefaultKeyGrace, "how long the previous data-plane key stays valid after --rotate-signing-key")
	forget := fs.String("forget-worker", "", "comma-separated worker `ids` whose credentials to drop at start, so that they can register anew (with the join token) after losing <data-dir>/worker.secret")
	deadline := fs.Duration("operation-deadline", 0, "how long a lifecycle operation may take (0: 30m)")
	e2bDomain := fs.String("e2b-domain", os.Getenv("AIRLOCK_E2B_DOMAIN"), "sandbox domain E2B answers name, for <port>-<id>.<domain> hosts behind wildcard DNS (or $AIRLOCK_E2B_DOMAIN; default: the host a request came to)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	metricsAddr := addMetricsFlag(fs)
	otlp := addTraceFlag(fs)
	var warm warmFlag
	fs.Var(&warm, "warm", warmUsage+"; a template no worker has yet is retried")
	quotas := addQuotaFlags(fs)
	blobURL := addBlobStoreFlag(fs)
	lossGrace := fs.Duration("worker-loss-grace", controller.DefaultWorkerLossGrace, "how long a worker may go without a heartbeat before it is lost, with its sandboxes")
	placement := fs.String("placement", string(scheduler.Spread), "how new sandboxes are placed among the workers that fit: spread (most free capacity first) or pack (least free first, keeping whole workers free)")
	onLoss := fs.String("on-worker-loss", controller.OnLossMark, "what becomes of a lost worker's sandboxes whose last snapshot is in the blob store: mark (lost, like the rest) or restore (restored from that snapshot on another worker, losing what changed after it)")
	tlsf := addTLSFlags(fs, "the API and the worker API")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if *workerToken, err = secretFlag("worker-token", *workerToken, *workerTokenFile, "AIRLOCK_WORKER_TOKEN"); err != nil {
		return err
	}
	if *workerToken == "" {
		return errors.New("--worker-token-file (or $AIRLOCK_WORKER_TOKEN) is required: workers register with that join token")
	}
	tlsCfg, err := tlsf.serverConfig()
	if err != nil {
		return err
	}
	if err := tlsf.trust(); err != nil {
		return err
	}
	log := newLogger(*logLevel)
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	tp, err := startTracing(ctx, tracing.ServiceServer, *otlp, log)
	if err != nil {
		return err
	}
	defer tracing.ShutdownAll(tp)
	now := time.Now // the one clock of the store, the controller and the service
	st, err := openStore(ctx, *db, *dataDir, now)
	if err != nil {
		return err
	}
	defer st.Close()
	if *lossGrace <= 0 {
		return errors.New("--worker-loss-grace must be positive")
	}
	policy, err := scheduler.ParsePolicy(*placement)
	if err != nil {
		return fmt.Errorf("--placement: %w", err)
	}
	placer := scheduler.Default{Policy: policy}
	srv, err := newServer(ctx, st, *workerToken, *deadline, log, now, tp.TracerProvider(), controllerInstance(*listen), quotas.apply,
		func(c *service.Config) { c.WorkerLossGrace = *lossGrace; c.Placer = placer })
	if err == nil {
		srv.e2b.SetDomain(*e2bDomain)
	}
	if err != nil {
		return err
	}
	if err := srv.ctrl.SetWorkerLoss(*lossGrace, *onLoss); err != nil {
		return err
	}
	srv.ctrl.SetPlacer(placer)
	if *blobURL != "" {
		b, err := blob.Open(ctx, *blobURL)
		if err != nil {
			return fmt.Errorf("--blob-store: %w", err)
		}
		srv.ctrl.SetBlobStore(b)
		log.Info("blob store", "url", b.String())
	}
	m, err := startMetrics(ctx, *metricsAddr, log)
	if err != nil {
		return err
	}
	m.watchServer(srv)
	if err := ensureAdminKey(ctx, srv.svc, *dataDir, progressWriter{}); err != nil {
		return err
	}
	if err := forgetWorkers(ctx, st, *forget, progressWriter{}); err != nil {
		return err
	}
	if *rotate {
		kid, err := srv.ctrl.RotateSigningKey(ctx, *grace)
		if err != nil {
			return err
		}
		fmt.Fprintf(progressWriter{}, "data-plane signing key rotated: new key %s; the previous one stays valid for %s\n", kid, *grace)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	ln, scheme := listenTLS(ln, tlsCfg)
	fmt.Fprintf(progressWriter{}, "server listening on %s://%s\n", scheme, ln.Addr())
	if len(warm) > 0 {
		go func() {
			if err := applyWarm(ctx, srv.svc, warm, 2*time.Second, log); err != nil && ctx.Err() == nil {
				log.Error("warm pools", "err", err)
			}
		}()
	}
	err = srv.serve(ctx, ln)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func workerCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("airlock worker", flag.ContinueOnError)
	serverURL := fs.String("server", "http://127.0.0.1:7070", "base URL of the server, or several comma-separated (server replicas on one PostgreSQL: the worker fails over between them)")
	workerToken := fs.String("worker-token", os.Getenv("AIRLOCK_WORKER_TOKEN"), "the server's join token (or $AIRLOCK_WORKER_TOKEN); prefer --worker-token-file: a command line is visible in ps")
	workerTokenFile := fs.String("worker-token-file", "", "`file` holding the server's join token")
	dataDir := fs.String("data-dir", DefaultDataDir(), "directory for runsc, templates and sandboxes")
	withQEMU := fs.Bool("qemu", true, "also offer the qemu microVM runtime (set up in the background on first start)")
	images := fs.String("template-images", DefaultTemplateImages, templateImagesUsage)
	shipped := fs.String("build-templates", defaultShipped, shippedUsage)
	dataListen := fs.String("data-listen", "127.0.0.1:7071", "address of the data plane")
	capf := addCapacityFlags(fs)
	advertise := fs.String("advertise-url", "", "data-plane URL clients use (default http(s)://<data-listen>)")
	id := fs.String("id", "", "worker id (default: generated once and kept in <data-dir>/worker.id)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	eg := addEgressFlags(fs)
	metricsAddr := addMetricsFlag(fs)
	otlp := addTraceFlag(fs)
	blobURL := addBlobStoreFlag(fs)
	tlsf := addTLSFlags(fs, "the data plane")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if *workerToken, err = secretFlag("worker-token", *workerToken, *workerTokenFile, "AIRLOCK_WORKER_TOKEN"); err != nil {
		return err
	}
	if *workerToken == "" {
		return errors.New("--worker-token-file (or $AIRLOCK_WORKER_TOKEN) is required: the worker registers with the server's join token")
	}
	tlsCfg, err := tlsf.serverConfig()
	if err != nil {
		return err
	}
	if err := tlsf.trust(); err != nil {
		return err
	}
	capacity, err := capf.resolve()
	if err != nil {
		return err
	}
	log := newLogger(*logLevel)
	m, err := startMetrics(ctx, *metricsAddr, log)
	if err != nil {
		return err
	}
	tp, err := startTracing(ctx, tracing.ServiceWorker, *otlp, log)
	if err != nil {
		return err
	}
	defer tracing.ShutdownAll(tp)
	w, err := newWorker(ctx, workerOptions{
		capacity: capacity,
		dataDir:  *dataDir, serverURL: *serverURL, token: *workerToken,
		dataListen: *dataListen, advertise: *advertise, id: *id, log: log, progress: progressWriter{},
		qemu: *withQEMU, templateImages: runtimeSet(*images), tls: tlsCfg, egress: eg, metrics: m,
		shipped: runtimeSet(*shipped), tracer: tp.TracerProvider(), blobStore: *blobURL,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(progressWriter{}, "worker serving; server %s\n", *serverURL)
	err = w.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func openStore(ctx context.Context, db, dataDir string, now func() time.Time) (store.Store, error) {
	switch {
	case strings.HasPrefix(db, "postgres://"), strings.HasPrefix(db, "postgresql://"):
		st, err := postgres.Open(ctx, db, sqlstore.WithClock(now))
		if err != nil {
			return nil, fmt.Errorf("open postgres: %w", err)
		}
		return st, nil
	case db == "":
		db = filepath.Join(dataDir, "airlock.db")
	}
	db = strings.TrimPrefix(db, "sqlite://")
	st, err := sqlite.Open(ctx, db, sqlstore.WithClock(now))
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", db, err)
	}
	return st, nil
}

type server struct {
	svc   *service.Service
	cfg   service.Config // what svc was made of
	ctrl  *controller.Controller
	e2b   *e2bcompat.Adapter
	h     http.Handler
	log   *slog.Logger
	local atomic.Pointer[localWorker]
	// observeAPI receives every native and E2B API request once metrics are on
	// (watchServer).
	observeAPI atomic.Pointer[func(method, route string, status int, d time.Duration)]
}

// controllerInstance names this server among replicas on one store (the
// controller lease's holder): its host and listen address, stable across
// restarts, so a replica that restarts after a crash takes its lease back
// at once instead of waiting for it to expire.
func controllerInstance(listen string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return host + "/" + listen
}

// newServer builds the server's parts over st; tune, if set, adjusts the
// service's configuration before the service is made (quotas, readiness,
// the data-plane client).
// tp traces API requests, the controller's transitions and the data-plane
// calls (nil: off).
func newServer(ctx context.Context, st store.Store, workerToken string, deadline time.Duration, log *slog.Logger, now func() time.Time, tp trace.TracerProvider, instance string, tune ...func(*service.Config)) (*server, error) {
	ev := events.New(st)
	ev.Now = now
	go ev.Listen(ctx) // other servers' appends wake this one's long polls, streams and controller
	ctrl := controller.New(controller.Config{
		Store: st, Events: ev, Logger: log.With("component", "controller"),
		WorkerToken: workerToken, OperationDeadline: deadline, Now: now, Tracer: tp, Instance: instance,
	})
	cfg := service.Config{
		Store: st, Events: ev, Kick: ctrl.Kick, SigningKey: ctrl.CurrentSigningKey, Ready: ctrl.Ready,
		Placer: ctrl.Placer(), // imports place as the controller does
		Logger: log.With("component", "api"), OperationDeadline: deadline, Now: now,
	}
	for _, t := range tune {
		t(&cfg)
	}
	cfg.DataPlane = tracedDataPlane(cfg.DataPlane, tp)
	svc := service.New(cfg)
	srv := &server{svc: svc, cfg: cfg, ctrl: ctrl, log: log}
	srv.e2b = e2bcompat.New(svc, e2bcompat.Options{
		// envd access tokens live as long as their sandbox and never leave
		// the servers: signed with the installation's first key, which
		// rotation keeps (worker tokens use the service's current key).
		Logger: log.With("component", "e2b"), SigningKey: ctrl.SigningKey,
		LocalWorker: srv.localWorker,
		Observe: func(method, route string, status int, d time.Duration) {
			if f := srv.observeAPI.Load(); f != nil {
				(*f)(method, route, status, d)
			}
		},
	})
	native := api.New(svc, api.Options{Logger: log.With("component", "api"), Tracer: tp,
		Observe: func(method, route string, status int, d time.Duration) {
			if f := srv.observeAPI.Load(); f != nil {
				(*f)(method, route, status, d)
			}
		}})
	mux := http.NewServeMux()
	mux.Handle("/internal/", ctrl.Handler())
	mux.Handle("/v1/", native)
	mux.Handle("/healthz", native)
	console := ui.Handler(ui.Options{DataPlaneOrigins: svc.DataPlaneOrigins, Logger: log.With("component", "ui")})
	mux.Handle("/ui/", console) // the web console (docs/console.md)
	mux.Handle("/ui", console)
	mux.Handle("/", srv.e2b.API()) // E2B's control plane: /sandboxes, /v2/sandboxes, …
	// Sandbox traffic (E2b-Sandbox-Id header or <port>-<id>.<domain> host)
	// goes to the sandbox's worker data plane whatever its path.
	srv.h = srv.e2b.Sandboxes(mux)
	return srv, nil
}

// localWorker returns the data-plane handler of the in-process worker id
// (`airlock up`), or nil.
func (s *server) localWorker(id string) http.Handler {
	if lw := s.local.Load(); lw != nil && lw.id == id {
		return lw.h
	}
	return nil
}

// setLocalWorker makes sandbox traffic for worker id go to h in-process.
func (s *server) setLocalWorker(id string, h http.Handler) {
	s.local.Store(&localWorker{id: id, h: h})
}

type localWorker struct {
	id string
	h  http.Handler
}

// serve runs the controllers and the HTTP server until ctx ends.
func (s *server) serve(ctx context.Context, ln net.Listener) error {
	hs := httplimit.Control.Server(s.h) // header, idle and body-stall timeouts; 64 KiB headers
	errc := make(chan error, 3)
	go func() { errc <- s.ctrl.Run(ctx) }()
	go func() { errc <- hs.Serve(ln) }()
	select {
	case <-ctx.Done():
	case err := <-errc:
		if ctx.Err() == nil && err != nil && !errors.Is(err, http.ErrServerClosed) {
			hs.Close()
			return err
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	return nil
}

type workerOptions struct {
	dataDir, serverURL, token, dataListen, advertise, id string
	log                                                  *slog.Logger
	progress                                             io.Writer
	qemu                                                 bool // also offer the qemu runtime
	// templateImages: runtimes whose creates restore a template image.
	templateImages map[string]bool
	tls            *tls.Config          // serve the data plane over TLS (nil: http)
	httpClient     *http.Client         // calls the server (nil: the default)
	egress         egressFlags          // --egress and its settings (zero: off)
	metrics        *metrics             // --metrics-addr's registry (nil: off)
	tracer         trace.TracerProvider // --otlp-endpoint's (nil: off)
	// shipped: the shipped templates built at start (--build-templates).
	shipped map[string]bool
	// capacity: what the worker offers (capacityFlags.resolve of
	// --cpu-overcommit and friends; both callers set it).
	capacity capacity
	// blobStore: --blob-store's URL ("": none).
	blobStore string
}

// addBlobStoreFlag adds --blob-store (default $AIRLOCK_BLOB_STORE).
func addBlobStoreFlag(fs *flag.FlagSet) *string {
	return fs.String("blob-store", os.Getenv("AIRLOCK_BLOB_STORE"), "shared blob store `URL` for suspend snapshots, so a suspended sandbox can wake on any worker on the same store: file:///DIR (a directory the workers share) or s3://BUCKET[/PREFIX]?endpoint=URL&region=R (credentials from $AWS_ACCESS_KEY_ID/$AWS_SECRET_ACCESS_KEY); on servers it garbage-collects the store (or $AIRLOCK_BLOB_STORE; default: none, snapshots stay on their worker)")
}

// templateImagesUsage documents --template-images.
const templateImagesUsage = "comma-separated runtimes whose creates restore a started-and-checkpointed template image instead of booting (\"\": only templates with a start command do, on every runtime; \"none\": not even those)"

// DefaultTemplateImages is where restoring beats booting on these machines
// (QEMU boots a kernel; a gVisor boot is a ~0.1 s process start).
const DefaultTemplateImages = "qemu"

func runtimeSet(list string) map[string]bool {
	m := map[string]bool{}
	for _, r := range strings.Split(list, ",") {
		if r = strings.TrimSpace(r); r != "" {
			m[r] = true
		}
	}
	return m
}

// newWorker does the worker's set-up (runsc, base template) and returns a
// worker ready to Run.
func newWorker(ctx context.Context, o workerOptions) (*worker.Worker, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the worker runs sandboxes with runsc and needs root (run it with sudo)")
	}
	if err := os.MkdirAll(o.dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	// The agent first: a dynamic one refuses the start before any set-up.
	agent, err := findAgent()
	if err != nil {
		return nil, err
	}
	if agent, err = staticAgent(ctx, agent, o.dataDir, o.progress); err != nil {
		return nil, err
	}
	runsc, err := setup.EnsureRunsc(ctx, o.dataDir, o.progress)
	if err != nil {
		return nil, fmt.Errorf("set up runsc: %w", err)
	}
	if _, _, err := setup.EnsureDebianTemplate(ctx, o.dataDir, agent, o.progress); err != nil {
		return nil, fmt.Errorf("set up the base template: %w", err)
	}
	drivers, err := o.runtimes(ctx, runsc, agent)
	if err != nil {
		return nil, err
	}
	snaps, err := snapshot.Open(filepath.Join(o.dataDir, "snapshots"))
	if err != nil {
		return nil, fmt.Errorf("open the snapshot store: %w", err)
	}
	var blobs blob.Store
	if o.blobStore != "" {
		if blobs, err = blob.Open(ctx, o.blobStore); err != nil {
			return nil, fmt.Errorf("--blob-store: %w", err)
		}
		o.log.Info("blob store", "url", blobs.String())
	}
	// Before the worker runs: a suspend whose checkpoint was complete when
	// the previous worker died is committed; anything else it left
	// uncommitted goes.
	if ms, err := snaps.Recover(); err != nil {
		o.log.Warn("snapshot store recovery", "err", err)
	} else {
		for _, m := range ms {
			o.log.Info("recovered a snapshot completed before a crash", "sandbox", m.SandboxID, "snapshot", m.ID, "kind", m.Kind)
		}
	}
	if err := snaps.GC(); err != nil {
		o.log.Warn("snapshot store clean-up", "err", err)
	}
	id := o.id
	if id == "" {
		if id, err = persistentID(filepath.Join(o.dataDir, "worker.id")); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", o.dataListen)
	if err != nil {
		return nil, fmt.Errorf("listen for the data plane on %s: %w", o.dataListen, err)
	}
	ln, scheme := listenTLS(ln, o.tls)
	adv := o.advertise
	if adv == "" {
		adv = scheme + "://" + ln.Addr().String()
	}
	o.log.Info("worker capacity", "vcpus", o.capacity.vcpus, "memory_mib", o.capacity.mib, "memory_reserve_mib", o.capacity.reserveMiB)
	var netCfg network.Config
	var gw worker.Gateway
	netLog := worker.NewNetLog()
	if o.egress.on != nil {
		if netCfg, gw, err = o.egress.gateway(o.log, &egressRecorder{log: netLog, metrics: o.metrics}); err != nil {
			return nil, err
		}
	}
	w, err := worker.New(worker.Config{
		Network: netCfg, Gateway: gw, NetLog: netLog, Observer: o.metrics.workerObserver(),
		ID: id, ServerURL: o.serverURL, WorkerToken: o.token, SecretFile: filepath.Join(o.dataDir, "worker.secret"), HTTPClient: o.httpClient,
		DataPlaneListener: ln, DataPlaneURL: adv, Driver: drivers, Snapshots: snaps, Blobs: blobs, TemplateImages: o.templateImages,
		Templates: func() ([]model.Template, error) { return image.ListTemplates(o.dataDir) },
		RootFS:    func(digest string) string { return image.TemplateRootFS(o.dataDir, digest) },
		RemoveTemplate: func(digest string, notAfter time.Time) (bool, error) {
			return image.RemoveTemplate(o.dataDir, digest, notAfter)
		},
		Builder: &build.Builder{Dir: o.dataDir, Agent: agent, Log: o.log.With("component", "builder")},
		ImportTemplate: func(ctx context.Context, archive, name, tag, ref string) (model.Template, error) {
			rep, err := oci.Import(ctx, o.dataDir, archive, oci.Options{Name: name, Tag: tag, Ref: ref, Agent: agent})
			return rep.Template, err
		},
		CapacityMiB:   o.capacity.mib,
		CapacityVCPUs: o.capacity.vcpus,
		FreeMiB:       o.capacity.free,
		Logger:        o.log.With("component", "worker"),
		Tracer:        o.tracer,
	})
	if err != nil {
		return nil, err
	}
	buildShipped(ctx, w, o.shipped, o.progress, o.log.With("component", "builder"))
	return w, nil
}

// runtimes makes the worker's drivers, one per runtime name, the first the
// default: the place a new runtime is added (a driver set up in the
// background goes in an airruntime.Lazy, as qemu does). What each can do is
// its own declaration (airruntime.Info), registered with the server.
func (o workerOptions) runtimes(ctx context.Context, runsc, agent string) (*airruntime.Multi, error) {
	type entry struct {
		name string
		on   bool
		make func() (airruntime.Driver, error)
	}
	entries := []entry{
		{gvisor.Name, true, func() (airruntime.Driver, error) {
			return gvisor.New(gvisor.Config{
				RunscPath: runsc,
				StateDir:  filepath.Join(o.dataDir, "runsc"),
				RunDir:    filepath.Join(o.dataDir, "run"),
				Logger:    o.log.With("component", "gvisor"),
			})
		}},
		{qemu.Name, o.qemu, func() (airruntime.Driver, error) {
			return newLazyQEMU(ctx, o.dataDir, agent, o.progress, o.log), nil
		}},
	}
	m := &airruntime.Multi{Drivers: map[string]airruntime.Driver{}}
	for _, e := range entries {
		if !e.on {
			continue
		}
		d, err := e.make()
		if err != nil {
			return nil, err
		}
		if m.Default == "" {
			m.Default = e.name
		}
		m.Drivers[e.name] = d
	}
	return m, nil
}

// findAgent locates airlock-agent: beside this executable, then on PATH.
func findAgent() (string, error) {
	if p := os.Getenv("AIRLOCK_AGENT"); p != "" {
		return p, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "airlock-agent")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := execLookPath("airlock-agent"); err == nil {
		return p, nil
	}
	return "", errors.New("airlock-agent not found beside the airlock binary or on PATH; build it with ./scripts/build.sh (or set AIRLOCK_AGENT)")
}

// staticAgent returns a statically linked agent. The agent is PID 1 of every
// sandbox (QEMU's /init, where no libc exists), so a cgo build of
// airlock-agent (a plain `go build ./cmd/...`) does not do. For a dynamic one
// it rebuilds the agent with CGO_ENABLED=0 into <dataDir>/bin when the module
// source is at hand (the working directory, or the parent of the directory
// holding the airlock binary: `go build -o bin/ ./cmd/...`) and go is on
// PATH; otherwise it fails with a message saying how to build one, so the
// worker refuses to start instead of half-starting.
func staticAgent(ctx context.Context, agent, dataDir string, progress io.Writer) (string, error) {
	f, err := elf.Open(agent)
	if err != nil {
		return "", fmt.Errorf("airlock-agent %s: %w; build it with ./scripts/build.sh", agent, err)
	}
	// An ELF interpreter (the C library's loader) is what makes it unusable
	// as /init; the same test as the qemu set-up's. A static-pie has a
	// dynamic section but relocates itself, and is fine.
	dynamic := false
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			dynamic = true
		}
	}
	f.Close()
	if !dynamic {
		return agent, nil
	}
	refuse := func(why string) (string, error) {
		return "", fmt.Errorf("airlock-agent %s is dynamically linked, but the agent is every sandbox's PID 1 (the QEMU guest's /init) and must be static; %s. "+
			"Build it with ./scripts/build.sh (or CGO_ENABLED=0 go build -o bin/ ./cmd/airlock-agent) and start again", agent, why)
	}
	src := moduleSource()
	if src == "" {
		return refuse("no airlock source tree to rebuild it from (neither the working directory nor the parent of the airlock binary's directory)")
	}
	gobin, err := execLookPath("go")
	if err != nil {
		return refuse("go is not on PATH to rebuild it from " + src)
	}
	out := filepath.Join(dataDir, "bin", "airlock-agent")
	fmt.Fprintf(progress, "agent: %s is dynamically linked; building a static one (CGO_ENABLED=0) from %s into %s\n", agent, src, out)
	cmd := exec.CommandContext(ctx, gobin, "build", "-trimpath", "-o", out, "./cmd/airlock-agent")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return refuse(fmt.Sprintf("rebuilding it failed (%v): %s", err, strings.TrimSpace(string(b))))
	}
	return out, nil
}

// moduleSource is the root of this module's source tree: the working
// directory or the parent of the airlock binary's directory; "" if neither.
func moduleSource() string {
	var dirs []string
	if wd, err := os.Getwd(); err == nil {
		dirs = append(dirs, wd)
	}
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(filepath.Dir(exe)))
	}
	for _, d := range dirs {
		mod, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.Contains(string(mod), "module github.com/airlock/airlock\n") {
			if _, err := os.Stat(filepath.Join(d, "cmd", "airlock-agent")); err == nil {
				return d
			}
		}
	}
	return ""
}

// ensureAdminKey makes sure <dataDir>/admin.key holds a working admin key of
// the default org, creating the org and key on first start. When the file
// is missing or its key no longer works (revoked, expired, from another
// installation) it mints a new admin key and says so on progress, with the
// reason and the new key's id (never its secret): earlier admin keys keep
// working until revoked.
func ensureAdminKey(ctx context.Context, svc *service.Service, dataDir string, progress io.Writer) error {
	path := filepath.Join(dataDir, "admin.key")
	secret, created, err := svc.Bootstrap(ctx)
	if err != nil {
		return fmt.Errorf("bootstrap the default org: %w", err)
	}
	if created {
		if err := writeFileAtomic(path, []byte(secret+"\n"), 0o600); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		fmt.Fprintf(progress, "created the installation's first admin key; written to %s\n", path)
		return nil
	}
	why := "was missing"
	if k := readTrim(path); k != "" {
		_, err := svc.Authenticate(ctx, k)
		if err == nil {
			return nil
		}
		why = "held a key that does not work (" + err.Error() + ")"
	}
	p := service.Principal{OrgID: service.DefaultOrgID, Admin: true}
	key, secret, err := svc.CreateKey(ctx, p, service.DefaultOrgID, "admin (airlock up)", true)
	if err != nil {
		return fmt.Errorf("create an admin key: %w", err)
	}
	if err := writeFileAtomic(path, []byte(secret+"\n"), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	fmt.Fprintf(progress, "minted a new admin key %s and wrote it to %s, because that file %s. Earlier admin keys still work: "+
		"list them with `airlock key ls --org %s` and revoke unused ones with `airlock key rm --org %s <key-id>`\n",
		key.ID, path, why, service.DefaultOrgID, service.DefaultOrgID)
	return nil
}

// nextPort is the address beside the API's: same host, port + 1, if free;
// else any free port. A stable data-plane address keeps attach URLs valid
// across restarts.
func nextPort(api net.Addr) string {
	ta, ok := api.(*net.TCPAddr)
	if !ok {
		return "127.0.0.1:0"
	}
	addr := net.JoinHostPort(ta.IP.String(), fmt.Sprint(ta.Port+1))
	if l, err := net.Listen("tcp", addr); err == nil {
		l.Close()
		return addr
	}
	return net.JoinHostPort(ta.IP.String(), "0")
}

// waitReady waits until the service can create sandboxes and this process's
// own worker has registered since it started (a heartbeat left by the
// previous run must not count: its data-plane address may be stale), or a
// component fails.
func waitReady(ctx context.Context, ctrl *controller.Controller, st store.Store, workerID string, since time.Time, errc <-chan error) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		w, err := st.GetWorker(ctx, workerID)
		if err == nil && w.LastHeartbeat.After(since) && ctrl.Ready(ctx) == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			return err
		case <-t.C:
		}
	}
}

func secretFile(path string) (string, error) {
	if s := readTrim(path); s != "" {
		return s, nil
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	s := hex.EncodeToString(b)
	if err := writeFileAtomic(path, []byte(s+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return s, nil
}

func persistentID(path string) (string, error) {
	if s := readTrim(path); s != "" {
		return s, nil
	}
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	id := "w-" + hex.EncodeToString(b)
	if err := writeFileAtomic(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return id, nil
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// progressWriter prefixes set-up progress lines on stderr.
type progressWriter struct{}

func (progressWriter) Write(p []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(p), "\n") {
		if line == "" {
			continue
		}
		fmt.Fprint(os.Stderr, "airlock: "+line)
	}
	return len(p), nil
}

var execLookPath = exec.LookPath
