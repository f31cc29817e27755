package agent

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// user is one account from the passwd database.
type user struct {
	Name   string
	UID    int
	GID    int
	Home   string
	Shell  string
	Groups []uint32 // supplementary groups, including the primary one
}

// userDB is a parsed /etc/passwd + /etc/group.
type userDB struct {
	users  []user
	groups []group
}

type group struct {
	name    string
	gid     int
	members []string
}

// loadUsers parses the passwd and group files; a missing file is an empty database.
func loadUsers(passwdPath, groupPath string) *userDB {
	db := &userDB{}
	eachLine(passwdPath, func(f []string) {
		if len(f) < 7 {
			return
		}
		uid, err1 := strconv.Atoi(f[2])
		gid, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			return
		}
		db.users = append(db.users, user{Name: f[0], UID: uid, GID: gid, Home: f[5], Shell: f[6]})
	})
	eachLine(groupPath, func(f []string) {
		if len(f) < 4 {
			return
		}
		gid, err := strconv.Atoi(f[2])
		if err != nil {
			return
		}
		var members []string
		for _, m := range strings.Split(f[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				members = append(members, m)
			}
		}
		db.groups = append(db.groups, group{name: f[0], gid: gid, members: members})
	})
	return db
}

func eachLine(path string, fn func(fields []string)) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fn(strings.Split(line, ":"))
	}
}

// lookup finds a user by name or numeric uid. A numeric uid without an entry
// is accepted with gid = uid, home "/" and shell /bin/sh.
func (db *userDB) lookup(nameOrUID string) (user, bool) {
	var found *user
	for i := range db.users {
		if db.users[i].Name == nameOrUID {
			found = &db.users[i]
			break
		}
	}
	if found == nil {
		uid, err := strconv.Atoi(nameOrUID)
		if err != nil || uid < 0 {
			return user{}, false
		}
		for i := range db.users {
			if db.users[i].UID == uid {
				found = &db.users[i]
				break
			}
		}
		if found == nil {
			return user{Name: nameOrUID, UID: uid, GID: uid, Home: "/", Shell: "/bin/sh", Groups: []uint32{uint32(uid)}}, true
		}
	}
	u := *found
	u.Groups = []uint32{uint32(u.GID)}
	for _, g := range db.groups {
		if g.gid == u.GID {
			continue
		}
		for _, m := range g.members {
			if m == u.Name {
				u.Groups = append(u.Groups, uint32(g.gid))
				break
			}
		}
	}
	if u.Home == "" {
		u.Home = "/"
	}
	if u.Shell == "" {
		u.Shell = "/bin/sh"
	}
	return u, true
}

// userName returns the name of uid, or "" if unknown.
func (db *userDB) userName(uid int) string {
	for _, u := range db.users {
		if u.UID == uid {
			return u.Name
		}
	}
	return ""
}

func (a *Agent) users() *userDB { return loadUsers(a.cfg.PasswdPath, a.cfg.GroupPath) }
