package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// qmp runs one QMP command on a fresh connection to the sandbox's monitor
// (QEMU serves one client at a time; callers hold the sandbox lock) and
// decodes its "return" into out when out is not nil.
func (d *Driver) qmp(ctx context.Context, id, cmd string, args any, out any) error {
	return d.qmpSeq(ctx, id, []qmpCmd{{name: cmd, args: args, out: out}})
}

type qmpCmd struct {
	name string
	args any
	out  any
	// fd, when set, travels with the command (SCM_RIGHTS), as "getfd"
	// needs: QEMU runs with spawn=deny and as an unprivileged user, so it
	// can neither exec a helper nor open the snapshot files itself.
	fd *os.File
}

func (d *Driver) qmpSeq(ctx context.Context, id string, cmds []qmpCmd) error {
	if _, ok := d.pid(id); !ok {
		return errors.New("qmp: qemu is not running")
	}
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unix", filepath.Join(d.dir(id), "qmp.sock"))
	if err != nil {
		return fmt.Errorf("qmp: %w", err)
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	if t, ok := ctx.Deadline(); ok && t.Before(deadline) {
		deadline = t
	}
	c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	dec := json.NewDecoder(c)
	enc := json.NewEncoder(c)
	var greeting map[string]json.RawMessage
	if err := dec.Decode(&greeting); err != nil {
		return fmt.Errorf("qmp greeting: %w", err)
	}
	call := func(q qmpCmd) error {
		req := map[string]any{"execute": q.name}
		if q.args != nil {
			req["arguments"] = q.args
		}
		if q.fd != nil {
			b, err := json.Marshal(req)
			if err != nil {
				return fmt.Errorf("qmp %s: %w", q.name, err)
			}
			uc, ok := c.(*net.UnixConn)
			if !ok {
				return fmt.Errorf("qmp %s: not a unix socket", q.name)
			}
			if _, _, err := uc.WriteMsgUnix(append(b, '\n'), syscall.UnixRights(int(q.fd.Fd())), nil); err != nil {
				return fmt.Errorf("qmp %s: %w", q.name, err)
			}
		} else if err := enc.Encode(req); err != nil {
			return fmt.Errorf("qmp %s: %w", q.name, err)
		}
		for {
			var resp struct {
				Return json.RawMessage `json:"return"`
				Error  *struct {
					Class string `json:"class"`
					Desc  string `json:"desc"`
				} `json:"error"`
				Event string `json:"event"`
			}
			if err := dec.Decode(&resp); err != nil {
				return fmt.Errorf("qmp %s: %w", q.name, err)
			}
			switch {
			case resp.Event != "":
				continue
			case resp.Error != nil:
				return fmt.Errorf("qmp %s: %s: %s", q.name, resp.Error.Class, resp.Error.Desc)
			case resp.Return != nil:
				if q.out != nil {
					if err := json.Unmarshal(resp.Return, q.out); err != nil {
						return fmt.Errorf("qmp %s: decode: %w", q.name, err)
					}
				}
				return nil
			}
		}
	}
	if err := call(qmpCmd{name: "qmp_capabilities"}); err != nil {
		return err
	}
	for _, q := range cmds {
		if err := call(q); err != nil {
			return err
		}
	}
	return nil
}

// waitMigration polls query-migrate until the migration completed.
func (d *Driver) waitMigration(ctx context.Context, id string) error {
	for {
		var r struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := d.qmp(ctx, id, "query-migrate", nil, &r); err != nil {
			return err
		}
		switch r.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", r.Status, r.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migration: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

var ignoreShared = map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}
