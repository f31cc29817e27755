// Package service holds Airlock's transport-free operations: authentication
// and authorization, validation, desired-state writes (sandboxes and their
// operations), command and file session tokens. The REST adapter
// (internal/api) and the E2B adapter translate their wire types into the
// service's own (params.go) and model's sentinel errors back to wire codes;
// the service knows neither API's routes nor their status codes (its
// messages do name /v1's fields, e.g. timeout_s). Its errors are in neutral
// words; a next step worth suggesting is a typed Hint (hint.go) that each
// adapter words for its own clients. Workers' data planes (command lists,
// checkpoint export and import, snapshot drops) are reached through an
// injected DataPlane (workerapi.DataPlane by default); the service signs
// each call's token and words the worker's failures (workerError). The
// service never drives a sandbox itself: it
// records what the user wants, appends events and kicks the controllers.
package service

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock/airlock/internal/events"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/scheduler"
	"github.com/airlock/airlock/internal/snapshot"
	"github.com/airlock/airlock/internal/store"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// DefaultRuntime is the runtime sandboxes get when the request names none.
const DefaultRuntime = "gvisor"

// Default per-key rate limit.
const (
	DefaultRateLimit = 100 // requests per second
	DefaultRateBurst = 200
)

// Config is what a Service is made of. Store and Events are required;
// every other field has a working default, so a Config with just those two
// is usable.
type Config struct {
	Store  store.Store
	Events *events.Log

	// Kick wakes the controllers after a desired-state change (nil: no-op).
	Kick func()
	// WorkerLossGrace is when a silent worker shows as lost (0:
	// scheduler.DefaultWorkerLossGrace; the server sets the controller's).
	WorkerLossGrace time.Duration
	// SigningKey returns the data-plane HMAC key (nil: StoreSigningKey(Store)).
	SigningKey func(ctx context.Context) ([]byte, error)
	// Ready reports whether the system can run sandboxes (nil:
	// scheduler.Ready over the store's workers, with
	// scheduler.DefaultHeartbeatTTL; the server sets the controller's Ready).
	Ready func(ctx context.Context) error
	// Placer picks the worker an imported sandbox's archive goes to (nil:
	// scheduler.Default); the server sets the controller's, so imports and
	// the controller place alike.
	Placer scheduler.Placer
	// Logger receives internal errors (nil: slog.Default()).
	Logger *slog.Logger
	// DefaultRuntime is used when a create request names none ("": "gvisor").
	DefaultRuntime string
	// OperationDeadline bounds every operation (0: model.DefaultOperationDeadline).
	OperationDeadline time.Duration
	// DataPlane calls workers' data planes (nil: a workerapi.DataPlane with
	// its default clients).
	DataPlane DataPlane
	// RateLimit is each API key's sustained request rate per second and
	// RateBurst its bucket size (0: DefaultRateLimit, DefaultRateBurst;
	// RateLimit < 0 disables limiting).
	RateLimit float64
	RateBurst int
	// Now returns the current time (nil: time.Now).
	Now func() time.Time
	// MaxDiskMiB is the largest resources.disk_mib a create may ask for
	// (0: DefaultMaxDiskMiB).
	MaxDiskMiB int
	// CreateRate is each org's sustained rate of create, fork and import
	// requests per second and CreateBurst its bucket size (0:
	// DefaultCreateRate, DefaultCreateBurst; CreateRate < 0 disables it).
	CreateRate  float64
	CreateBurst int
}

// Service is the set of operations the adapters call (New). The adapters
// reach the store and the event log only through it.
type Service struct {
	cfg Config
	st  store.Store
	ev  *events.Log

	onPoolClaim atomic.Pointer[func(hit bool)] // ObservePoolClaims

	limiter limiter
	// Quotas (quota.go).
	createLimiter limiter
	transfers     counter
	orgLocks      sync.Map // org id → *sync.Mutex

	// builds wakes BuildEvents long polls (builds.go).
	builds buildWaiters

	keyOnce sync.Once
	keyFn   func(ctx context.Context) ([]byte, error)

	installKeyOnce sync.Once
	cas            OrgCAs
	installKey     func(ctx context.Context) ([]byte, error)
}

// New returns the Service cfg describes.
func New(cfg Config) *Service {
	if cfg.WorkerLossGrace <= 0 {
		cfg.WorkerLossGrace = scheduler.DefaultWorkerLossGrace
	}
	return &Service{cfg: cfg, st: cfg.Store, ev: cfg.Events}
}

func (s *Service) now() time.Time {
	if s.cfg.Now != nil {
		return s.cfg.Now().UTC()
	}
	return time.Now().UTC()
}

func (s *Service) logger() *slog.Logger {
	if s.cfg.Logger != nil {
		return s.cfg.Logger
	}
	return slog.Default()
}

func (s *Service) kick() {
	if s.cfg.Kick != nil {
		s.cfg.Kick()
	}
}

func (s *Service) deadline() time.Duration {
	if s.cfg.OperationDeadline > 0 {
		return s.cfg.OperationDeadline
	}
	return model.DefaultOperationDeadline
}

func (s *Service) runtime() string {
	if s.cfg.DefaultRuntime != "" {
		return s.cfg.DefaultRuntime
	}
	return DefaultRuntime
}

// DataPlane is what the service asks of workers' data planes: a page of a
// sandbox's commands, a checkpoint's export, an archive's import, a
// sandbox's snapshots dropped. workerapi.DataPlane is the implementation;
// errors are as it documents.
type DataPlane interface {
	ListCommands(ctx context.Context, t workerapi.Target, sandboxID string, limit int, cursor string) (workerapi.CommandsPage, error)
	Export(ctx context.Context, t workerapi.Target, sandboxID, snapshotID string) (io.ReadCloser, int64, error)
	Import(ctx context.Context, t workerapi.Target, sandboxID string, archive io.Reader) (snapshot.Manifest, error)
	DropSnapshots(ctx context.Context, t workerapi.Target, sandboxID string) error
	DropSnapshot(ctx context.Context, t workerapi.Target, sandboxID, snapshotID string) error
	NetworkLog(ctx context.Context, t workerapi.Target, sandboxID string, after int64, limit int) (workerapi.NetLogPage, error)
}

var defaultDataPlane = &workerapi.DataPlane{}

func (s *Service) dataPlane() DataPlane {
	if s.cfg.DataPlane != nil {
		return s.cfg.DataPlane
	}
	return defaultDataPlane
}

func (s *Service) signingKey(ctx context.Context) ([]byte, error) {
	s.keyOnce.Do(func() {
		s.keyFn = s.cfg.SigningKey
		if s.keyFn == nil {
			s.keyFn = StoreSigningKey(s.st)
		}
	})
	key, err := s.keyFn(ctx)
	if err != nil {
		return nil, fmt.Errorf("load data-plane signing key: %w", err)
	}
	return key, nil
}

// CheckReady reports whether the system can run sandboxes: nil, or an error
// wrapping model.ErrUnavailable that says why.
func (s *Service) CheckReady(ctx context.Context) error {
	if s.cfg.Ready != nil {
		return s.cfg.Ready(ctx)
	}
	ws, err := s.st.ListWorkers(ctx)
	if err != nil {
		return model.Errorf(model.ErrUnavailable, "list workers: %v", err)
	}
	return scheduler.Ready(ws, s.now(), scheduler.DefaultHeartbeatTTL)
}

func (s *Service) placer() scheduler.Placer {
	if s.cfg.Placer != nil {
		return s.cfg.Placer
	}
	return scheduler.Default{}
}

// InstallationKey returns the installation's first data-plane key
// (StoreSigningKey over the service's store): the key that never rotates,
// for tokens that live as long as their sandbox (E2B's envd tokens).
func (s *Service) InstallationKey(ctx context.Context) ([]byte, error) {
	s.installKeyOnce.Do(func() { s.installKey = StoreSigningKey(s.st) })
	return s.installKey(ctx)
}

// StoreSigningKey returns a SigningKey func that reads the installation's
// first data-plane key from st (token.SigningKey, the same key as
// controller.Controller.SigningKey), creating it on first use. The key never
// changes once stored, so it is cached after the first read.
func StoreSigningKey(st store.Store) func(ctx context.Context) ([]byte, error) {
	var (
		mu  sync.Mutex
		key []byte
	)
	return func(ctx context.Context) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if key != nil {
			return key, nil
		}
		k, err := token.SigningKey(ctx, st)
		if err != nil {
			return nil, err
		}
		key = k
		return key, nil
	}
}

func newKey() []byte {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic(err)
	}
	return k
}
