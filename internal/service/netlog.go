package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/token"
	"github.com/airlock/airlock/internal/workerapi"
)

// NetworkLog is one page of a sandbox's network log: its egress
// decisions with Seq after the request's after, oldest first.
type NetworkLog struct {
	Entries []model.NetDecision
	// Next is the after of the following request (the last entry's Seq,
	// or the request's after when there is none).
	Next int64
	// Missed counts entries after the request's after that the log no
	// longer holds (it keeps the last model.NetLogSize).
	Missed int64
	// Reset says the log began again since the request's after (its
	// worker restarted, or the sandbox moved to another worker): Entries
	// start at its beginning.
	Reset bool
	// Note explains an empty log.
	Note string
}

// NetworkLog returns one page of sandbox id's network log: at most limit
// entries (0: workerapi.MaxNetLogPage) with Seq after after. The log is
// kept in memory by the worker that holds the sandbox (running, paused or
// suspended there): asking neither wakes the sandbox nor counts as
// activity. A sandbox on no worker (pending, deleted) has an empty log
// with a Note saying so; a worker that holds no log for it (it restarted)
// answers an empty one too. A worker that does not answer is
// model.ErrUnavailable.
func (s *Service) NetworkLog(ctx context.Context, p Principal, id string, after int64, limit int) (NetworkLog, error) {
	if after < 0 {
		return NetworkLog{}, model.Errorf(model.ErrUnprocessable, "after %d is out of range: pass 0 (from the start) or the next of the previous page", after)
	}
	if limit < 0 || limit > workerapi.MaxNetLogPage {
		return NetworkLog{}, model.Errorf(model.ErrUnprocessable, "limit %d is out of range: ask for 1 to %d entries (0 or none: %d)", limit, workerapi.MaxNetLogPage, workerapi.MaxNetLogPage)
	}
	sb, err := s.GetSandbox(ctx, p, id)
	if err != nil {
		return NetworkLog{}, err
	}
	empty := NetworkLog{Entries: []model.NetDecision{}, Next: after}
	if sb.WorkerID == "" || sb.State == model.StatePending || sb.State == model.StateDeleted {
		empty.Note = fmt.Sprintf("sandbox %s is %s and on no worker: the network log is kept in memory by the worker that holds a sandbox, so it has none now", sb.ID, sb.State)
		return empty, nil
	}
	w, err := s.workerOf(ctx, sb)
	if err != nil {
		return NetworkLog{}, err
	}
	t, err := s.target(ctx, w, sb, token.Claims{Scope: token.ScopeFiles})
	if err != nil {
		return NetworkLog{}, err
	}
	page, err := s.dataPlane().NetworkLog(ctx, t, sb.ID, after, limit)
	if errors.Is(err, model.ErrNotFound) {
		empty.Note = fmt.Sprintf("worker %s holds no network log for sandbox %s (the worker restarted, or the sandbox is moving): the log is kept in memory", w.ID, sb.ID)
		if after > 0 {
			empty.Reset, empty.Next = true, 0
		}
		return empty, nil
	}
	if err != nil {
		return NetworkLog{}, workerError(err, w.ID, "reading the network log of "+sb.ID)
	}
	return NetworkLog{Entries: page.Entries, Next: page.Next, Missed: page.Missed, Reset: page.Reset, Note: page.Note}, nil
}
