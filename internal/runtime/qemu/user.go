package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"os/user"
	"strconv"
	"sync"
)

var userMu sync.Mutex

// ensureSystemUser returns the uid and gid of the system user name,
// creating it (useradd --system, no home, no login shell) if it is missing.
// QEMU drops its privileges to that user (-runas).
func ensureSystemUser(ctx context.Context, name string) (uid, gid int, err error) {
	userMu.Lock()
	defer userMu.Unlock()
	u, err := user.Lookup(name)
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		out, aerr := exec.CommandContext(ctx, "useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
			"--shell", "/usr/sbin/nologin", "--user-group", "--comment", "Airlock sandbox runtime (unprivileged)", name).CombinedOutput()
		if aerr != nil {
			return 0, 0, fmt.Errorf("create system user %s: useradd: %w: %s", name, aerr, bytes.TrimSpace(out))
		}
		u, err = user.Lookup(name)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("system user %s: %w", name, err)
	}
	if uid, err = strconv.Atoi(u.Uid); err != nil {
		return 0, 0, fmt.Errorf("system user %s: uid %q: %w", name, u.Uid, err)
	}
	if gid, err = strconv.Atoi(u.Gid); err != nil {
		return 0, 0, fmt.Errorf("system user %s: gid %q: %w", name, u.Gid, err)
	}
	if uid == 0 {
		return 0, 0, fmt.Errorf("system user %s has uid 0: pick an unprivileged user", name)
	}
	return uid, gid, nil
}
