package controller

import (
	"context"
	"errors"
	"time"

	"github.com/airlock/airlock/internal/blob"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/scheduler"
	"github.com/airlock/airlock/internal/snapshot"
)

// Garbage collection of the shared blob store (Config.Blobs), by the
// replica that leads, every BlobGCInterval: a suspend snapshot's manifest
// goes once its sandbox is gone or has moved on from it (woken, suspended
// again, deleted), then every artifact no manifest lists; nothing younger
// than BlobGCGrace goes (a push reports its snapshot only once uploaded).
// Workers never delete from the blob store: a worker cannot tell whether
// another one now owns the sandbox.
const (
	BlobGCInterval = 10 * time.Minute
	BlobGCGrace    = 30 * time.Minute
)

// collectBlobs runs one garbage collection of the blob store.
func (c *Controller) collectBlobs(ctx context.Context) (snapshot.BlobGCStats, error) {
	if c.cfg.Blobs == nil {
		return snapshot.BlobGCStats{}, nil
	}
	var lookupErr error
	keep := func(sandboxID, snapshotID string) bool {
		sb, err := c.st.GetSandbox(ctx, sandboxID)
		if errors.Is(err, model.ErrNotFound) {
			return false
		}
		if err != nil {
			lookupErr = err
			return true // on doubt, keep
		}
		return sb.State != model.StateDeleted && sb.SnapshotID == snapshotID && sb.SnapshotShared
	}
	st, err := snapshot.GCBlobStore(ctx, c.cfg.Blobs, keep, BlobGCGrace, c.now())
	if err == nil {
		err = lookupErr
	}
	if st.Manifests > 0 || st.Blobs > 0 {
		c.log.Info("controller: blob store garbage collection", "manifests", st.Manifests, "blobs", st.Blobs, "bytes", st.Bytes, "blob_store", c.cfg.Blobs.String())
	}
	return st, err
}

// SetBlobStore sets Config.Blobs; call it before Run.
func (c *Controller) SetBlobStore(b blob.Store) { c.cfg.Blobs = b }

// SetWorkerLoss sets Config.WorkerLossGrace (0: keep) and
// Config.OnWorkerLoss; call it before Run. An unknown policy is an error.
func (c *Controller) SetWorkerLoss(grace time.Duration, policy string) error {
	switch policy {
	case OnLossMark, OnLossRestore:
	default:
		return model.Errorf(model.ErrInvalid, "--on-worker-loss %q: want %s or %s", policy, OnLossRestore, OnLossMark)
	}
	if grace > 0 {
		c.cfg.WorkerLossGrace = grace
	}
	c.cfg.OnWorkerLoss = policy
	return nil
}

// SetPlacer sets Config.Placer; call it before Run (and give the service
// the same one: its imports place through it).
func (c *Controller) SetPlacer(p scheduler.Placer) { c.cfg.Placer = p }
