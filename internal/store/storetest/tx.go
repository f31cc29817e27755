package storetest

import (
	"context"
	"errors"
	"testing"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/store"
)

// Transactions (Store.InTx): what callers write together.

// updateBoth is the controller's transaction: the guarded sandbox write
// and the operation's (written only while it is not Done).
func updateBoth(ctx context.Context, s store.Store, sb model.Sandbox, op model.Operation) (model.Sandbox, model.Operation, error) {
	err := s.InTx(ctx, func(tx store.Tx) error {
		var err error
		if sb, err = tx.UpdateSandbox(ctx, sb); err != nil {
			return err
		}
		op, err = tx.UpdateOperation(ctx, op)
		return err
	})
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	return sb, op, nil
}

// updateAndCreate is a lifecycle request's transaction: the guarded
// sandbox write (the desired state) and the insert of its operation.
func updateAndCreate(ctx context.Context, s store.Store, sb model.Sandbox, op model.Operation) (model.Sandbox, model.Operation, error) {
	err := s.InTx(ctx, func(tx store.Tx) error {
		var err error
		if sb, err = tx.UpdateSandbox(ctx, sb); err != nil {
			return err
		}
		if err := tx.CreateOperation(ctx, op); err != nil {
			return err
		}
		op, err = tx.GetOperation(ctx, op.ID)
		return err
	})
	if err != nil {
		return model.Sandbox{}, model.Operation{}, err
	}
	return sb, op, nil
}

// testInTx: a transaction's reads see its own writes; a failed fn leaves
// nothing behind and its error comes back as it is; a nested InTx is a
// savepoint, whose failure undoes only its own writes; the store's atomic
// methods (CreateSandbox with a key) work inside a transaction too.
func testInTx(t *testing.T, s store.Store) {
	ctx := context.Background()
	mkOrg(t, s, "org-a")
	sb := mkSandbox(t, s, newSandbox("org-a", "sb-1", at(0)))
	before, err := s.ListEvents(ctx, "", "", 0, 0)
	must(t, "list events", err)

	boom := errors.New("boom")
	err = s.InTx(ctx, func(tx store.Tx) error {
		w := sb
		w.Reason = "in tx"
		got, err := tx.UpdateSandbox(ctx, w)
		if err != nil {
			return err
		}
		seen, err := tx.GetSandbox(ctx, sb.ID)
		if err != nil {
			return err
		}
		if seen.Generation != got.Generation || seen.Reason != "in tx" {
			t.Errorf("read in tx = gen %d %q, want gen %d %q (its own write)", seen.Generation, seen.Reason, got.Generation, "in tx")
		}
		if _, err := tx.AppendEvent(ctx, model.Event{OrgID: "org-a", Type: "org.note"}); err != nil {
			return err
		}
		if _, err := tx.PutSettingIfAbsent(ctx, "k", "v"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) || err.Error() != "boom" {
		t.Fatalf("InTx = %v, want fn's error as it is", err)
	}
	after, err := s.GetSandbox(ctx, sb.ID)
	must(t, "get after rollback", err)
	if after.Generation != sb.Generation || after.Reason != "" {
		t.Errorf("sandbox after a failed transaction = gen %d %q, want gen %d unchanged", after.Generation, after.Reason, sb.Generation)
	}
	evs, err := s.ListEvents(ctx, "", "", 0, 0)
	must(t, "list events after rollback", err)
	if len(evs) != len(before) {
		t.Errorf("events after a failed transaction: %d, want %d", len(evs), len(before))
	}
	if v, err := s.PutSettingIfAbsent(ctx, "k", "other"); err != nil || v != "other" {
		t.Errorf("setting after a failed transaction = %q, %v; want unset (now other)", v, err)
	}

	// Nested: the inner failure undoes the inner write only.
	err = s.InTx(ctx, func(tx store.Tx) error {
		w := sb
		w.Reason = "outer"
		if _, err := tx.UpdateSandbox(ctx, w); err != nil {
			return err
		}
		ierr := tx.InTx(ctx, func(tx store.Tx) error {
			if _, err := tx.PutSettingIfAbsent(ctx, "inner", "x"); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(ierr, boom) {
			t.Errorf("nested InTx = %v, want boom", ierr)
		}
		// A failed statement inside a savepoint does not spoil the
		// transaction (on PostgreSQL it would, outside one).
		if err := tx.InTx(ctx, func(tx store.Tx) error {
			return tx.CreateOrg(ctx, model.Org{ID: "org-a", Name: "again", CreatedAt: at(0)})
		}); !errors.Is(err, model.ErrConflict) {
			t.Errorf("duplicate org in tx: %v, want ErrConflict", err)
		}
		return tx.InTx(ctx, func(tx store.Tx) error {
			_, err := tx.PutSettingIfAbsent(ctx, "inner2", "y")
			return err
		})
	})
	must(t, "nested transaction", err)
	after, err = s.GetSandbox(ctx, sb.ID)
	must(t, "get after nested", err)
	if after.Reason != "outer" {
		t.Errorf("outer write after nested = %q, want outer", after.Reason)
	}
	if v, _ := s.PutSettingIfAbsent(ctx, "inner", "z"); v != "z" {
		t.Errorf("inner setting = %q after its savepoint failed, want unset (now z)", v)
	}
	if v, _ := s.PutSettingIfAbsent(ctx, "inner2", "z"); v != "y" {
		t.Errorf("inner2 setting = %q, want y (its savepoint committed)", v)
	}

	// CreateSandbox with a used key inside a transaction returns the pair.
	sb2 := newSandbox("org-a", "sb-2", at(1))
	first, _, _, err := s.CreateSandbox(ctx, sb2, newOp(sb2, "op-sb-2"), "key-1")
	must(t, "create with key", err)
	err = s.InTx(ctx, func(tx store.Tx) error {
		sb3 := newSandbox("org-a", "sb-3", at(2))
		got, _, existed, err := tx.CreateSandbox(ctx, sb3, newOp(sb3, "op-sb-3"), "key-1")
		if err != nil {
			return err
		}
		if !existed || got.ID != first.ID {
			t.Errorf("create with a used key in tx = %s existed=%v, want %s existed", got.ID, existed, first.ID)
		}
		return nil
	})
	must(t, "create with a used key in tx", err)
}
