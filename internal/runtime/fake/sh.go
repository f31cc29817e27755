package fake

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"time"
)

// The fake guest's programs: Go functions over the guest's filesystem, not
// Linux processes. A small shell (sh -c, bash -c) runs command lists joined
// by ";", "&&", "||" and newlines, with '…' and "…" quoting and the
// redirections >, >>, 2>&1, >&2 and 2>/dev/null. No variables beyond $?,
// no loops, no pipes, no globs: a script that needs them exits 2 saying
// so. The programs: echo, cat, true, false, exit, hostname, id, rm, mkdir,
// test ([), grep (fixed strings), sleep, sync, pwd, ls.

// env is what a program runs with.
type env struct {
	ctx    context.Context
	g      *guest
	uid    int
	cwd    string
	stdout io.Writer
	stderr io.Writer
}

type program func(e *env, args []string) int

var programs map[string]program

func init() {
	programs = map[string]program{
		"echo": progEcho, "cat": progCat, "true": func(*env, []string) int { return 0 },
		"false": func(*env, []string) int { return 1 }, "hostname": progHostname, "id": progID,
		"rm": progRm, "mkdir": progMkdir, "test": progTest, "[": progTest, "grep": progGrep,
		"sleep": progSleep, "sync": func(*env, []string) int { return 0 }, "pwd": progPwd, "ls": progLs,
		"sh": progSh, "bash": progSh,
	}
}

// lookupProgram resolves argv[0] ("/bin/cat" and "cat" alike).
func lookupProgram(name string) (program, bool) {
	p, ok := programs[path.Base(name)]
	return p, ok
}

func (e *env) abs(p string) string {
	if strings.HasPrefix(p, "/") {
		return clean(p)
	}
	return clean(path.Join(e.cwd, p))
}

func (e *env) fail(prog, format string, args ...any) int {
	fmt.Fprintf(e.stderr, "%s: %s\n", prog, fmt.Sprintf(format, args...))
	return 1
}

func progEcho(e *env, args []string) int {
	nl := true
	if len(args) > 0 && args[0] == "-n" {
		nl, args = false, args[1:]
	}
	io.WriteString(e.stdout, strings.Join(args, " "))
	if nl {
		io.WriteString(e.stdout, "\n")
	}
	return 0
}

func progCat(e *env, args []string) int {
	code := 0
	for _, a := range args {
		e.g.mu.Lock()
		b, err := e.g.fs.read(e.abs(a))
		e.g.mu.Unlock()
		if err != nil {
			code = e.fail("cat", "%s: No such file or directory", a)
			continue
		}
		e.stdout.Write(b)
	}
	return code
}

func progHostname(e *env, _ []string) int {
	e.g.mu.Lock()
	h := e.g.hostname
	e.g.mu.Unlock()
	fmt.Fprintln(e.stdout, h)
	return 0
}

func progID(e *env, args []string) int {
	name := userName(e.uid)
	switch {
	case len(args) > 0 && (args[0] == "-u" || args[0] == "-g"):
		fmt.Fprintln(e.stdout, e.uid)
	case len(args) > 0 && args[0] == "-un":
		fmt.Fprintln(e.stdout, name)
	default:
		fmt.Fprintf(e.stdout, "uid=%d(%s) gid=%d(%s)\n", e.uid, name, e.uid, name)
	}
	return 0
}

// flags splits leading one-letter flags ("-rf") from args.
func flags(args []string) (map[byte]bool, []string) {
	f := map[byte]bool{}
	for len(args) > 0 && len(args[0]) > 1 && args[0][0] == '-' {
		for i := 1; i < len(args[0]); i++ {
			f[args[0][i]] = true
		}
		args = args[1:]
	}
	return f, args
}

func progRm(e *env, args []string) int {
	f, args := flags(args)
	code := 0
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	for _, a := range args {
		if err := e.g.fs.remove(e.abs(a), f['r'] || f['R']); err != nil && !f['f'] {
			code = e.fail("rm", "cannot remove '%s': %v", a, err)
		}
	}
	return code
}

func progMkdir(e *env, args []string) int {
	f, args := flags(args)
	code := 0
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	for _, a := range args {
		p := e.abs(a)
		if !f['p'] && (!e.g.fs.isDir(path.Dir(p)) || func() bool { _, err := e.g.fs.lookup(p); return err == nil }()) {
			code = e.fail("mkdir", "cannot create directory '%s'", a)
			continue
		}
		if err := e.g.fs.mkdirAll(p, 0o755, e.uid); err != nil {
			code = e.fail("mkdir", "cannot create directory '%s': %v", a, err)
		}
	}
	return code
}

func progTest(e *env, args []string) int {
	if len(args) > 0 && args[len(args)-1] == "]" {
		args = args[:len(args)-1]
	}
	if len(args) != 2 {
		return 2
	}
	e.g.mu.Lock()
	ent, err := e.g.fs.lookup(e.abs(args[1]))
	e.g.mu.Unlock()
	ok := err == nil
	switch args[0] {
	case "-e":
	case "-f":
		ok = ok && !ent.Dir
	case "-d":
		ok = ok && ent.Dir
	default:
		return 2
	}
	if ok {
		return 0
	}
	return 1
}

func progGrep(e *env, args []string) int {
	if len(args) != 2 {
		return e.fail("grep", "usage: grep STRING FILE")
	}
	e.g.mu.Lock()
	b, err := e.g.fs.read(e.abs(args[1]))
	e.g.mu.Unlock()
	if err != nil {
		e.fail("grep", "%s: No such file or directory", args[1])
		return 2
	}
	code := 1
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if strings.Contains(l, args[0]) {
			io.WriteString(e.stdout, l)
			code = 0
		}
	}
	return code
}

func progSleep(e *env, args []string) int {
	if len(args) != 1 {
		return e.fail("sleep", "usage: sleep SECONDS")
	}
	s, err := strconv.ParseFloat(args[0], 64)
	if err != nil || s < 0 {
		return e.fail("sleep", "invalid time interval '%s'", args[0])
	}
	t := time.NewTimer(time.Duration(s * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return 0
	case <-e.ctx.Done():
		return 1
	}
}

func progPwd(e *env, _ []string) int {
	fmt.Fprintln(e.stdout, e.cwd)
	return 0
}

func progLs(e *env, args []string) int {
	_, args = flags(args)
	if len(args) == 0 {
		args = []string{"."}
	}
	code := 0
	for _, a := range args {
		e.g.mu.Lock()
		ent, err := e.g.fs.lookup(e.abs(a))
		var names []string
		if err == nil && ent.Dir {
			names, err = e.g.fs.list(e.abs(a))
		} else if err == nil {
			names = []string{a}
		}
		e.g.mu.Unlock()
		if err != nil {
			code = e.fail("ls", "cannot access '%s': No such file or directory", a)
			continue
		}
		for _, n := range names {
			fmt.Fprintln(e.stdout, n)
		}
	}
	return code
}

// progSh is sh -c SCRIPT (and bash -c).
func progSh(e *env, args []string) int {
	if len(args) < 2 || args[0] != "-c" {
		return e.fail("sh", "the fake runtime's shell runs only -c SCRIPT")
	}
	cmds, err := parseScript(args[1])
	if err != nil {
		return e.failCode(2, "sh", "%v (runtime/fake's shell: no loops, pipes, variables or globs)", err)
	}
	status := 0
	for i, c := range cmds {
		if i > 0 {
			switch cmds[i-1].op {
			case "&&":
				if status != 0 {
					continue
				}
			case "||":
				if status == 0 {
					continue
				}
			}
		}
		if !e.g.wait(e.ctx) { // a paused guest runs nothing
			return 1
		}
		var exit bool
		status, exit = e.runCommand(c, status)
		if exit {
			return status
		}
	}
	return status
}

func (e *env) failCode(code int, prog, format string, args ...any) int {
	e.fail(prog, format, args...)
	return code
}

// command is one simple command of a script and the operator after it.
type command struct {
	words []string
	redir []redirect
	op    string // ";", "&&", "||" or "" at the end
}

type redirect struct {
	fd     int    // 1 or 2
	target string // a path, or "&1" / "&2"
	append bool
}

// runCommand runs c; exit reports an exit builtin.
func (e *env) runCommand(c command, last int) (status int, exit bool) {
	words := make([]string, len(c.words))
	for i, w := range c.words {
		words[i] = strings.ReplaceAll(w, "\x00?", strconv.Itoa(last))
	}
	if len(words) == 0 {
		return last, false
	}
	out, errw := e.stdout, e.stderr
	type pending struct {
		path   string
		append bool
		buf    *bytes.Buffer
	}
	var files []pending
	for _, r := range c.redir {
		var w io.Writer
		switch r.target {
		case "&1":
			w = out
		case "&2":
			w = errw
		case "/dev/null":
			w = io.Discard
		default:
			b := &bytes.Buffer{}
			files = append(files, pending{e.abs(r.target), r.append, b})
			w = b
		}
		if r.fd == 1 {
			out = w
		} else {
			errw = w
		}
	}
	// Redirections create (or truncate) their files first, as a shell does.
	for _, f := range files {
		if err := e.flush(f.path, nil, f.append); err != nil {
			fmt.Fprintf(e.stderr, "sh: %s: %v\n", f.path, err)
			return 1, false
		}
	}
	if words[0] == "exit" {
		code := last
		if len(words) > 1 {
			code, _ = strconv.Atoi(words[1])
		}
		return code, true
	}
	p, ok := lookupProgram(words[0])
	if !ok {
		fmt.Fprintf(e.stderr, "sh: %s: not found\n", words[0])
		return 127, false
	}
	sub := *e
	sub.stdout, sub.stderr = out, errw
	status = p(&sub, words[1:])
	for _, f := range files {
		if err := e.flush(f.path, f.buf.Bytes(), true); err != nil {
			fmt.Fprintf(e.stderr, "sh: %s: %v\n", f.path, err)
			return 1, false
		}
	}
	return status, false
}

// flush appends data to file p (creating it; truncating it unless app).
func (e *env) flush(p string, data []byte, app bool) error {
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	var old []byte
	if app {
		old, _ = e.g.fs.read(p)
	}
	return e.g.fs.write(p, append(bytes.Clone(old), data...), 0o644, e.uid)
}

// parseScript splits a script into simple commands.
func parseScript(s string) ([]command, error) {
	var cmds []command
	cur := command{}
	var word strings.Builder
	inWord := false
	endWord := func() {
		if inWord {
			cur.words = append(cur.words, word.String())
			word.Reset()
			inWord = false
		}
	}
	endCmd := func(op string) {
		endWord()
		if len(cur.words) > 0 || len(cur.redir) > 0 {
			cur.op = op
			cmds = append(cmds, cur)
		}
		cur = command{}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated quote")
			}
			word.WriteString(s[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case c == '"':
			j := strings.IndexByte(s[i+1:], '"')
			if j < 0 {
				return nil, fmt.Errorf("unterminated quote")
			}
			in := s[i+1 : i+1+j]
			if strings.ContainsAny(strings.ReplaceAll(in, "$?", ""), "$`\\") {
				return nil, fmt.Errorf("unsupported expansion in %q", in)
			}
			word.WriteString(strings.ReplaceAll(in, "$?", "\x00?"))
			inWord = true
			i += j + 1
		case c == ' ' || c == '\t':
			endWord()
		case c == '\n' || c == ';':
			endCmd(";")
		case c == '&' && i+1 < len(s) && s[i+1] == '&':
			endCmd("&&")
			i++
		case c == '|' && i+1 < len(s) && s[i+1] == '|':
			endCmd("||")
			i++
		case c == '>' || (c == '2' && !inWord && i+1 < len(s) && s[i+1] == '>') || (c == '1' && !inWord && i+1 < len(s) && s[i+1] == '>'):
			endWord()
			r := redirect{fd: 1}
			if c == '2' || c == '1' {
				r.fd = int(c - '0')
				i++
			}
			if i+1 < len(s) && s[i+1] == '>' {
				r.append = true
				i++
			}
			if i+1 < len(s) && s[i+1] == '&' {
				i++
			}
			j := i + 1
			for j < len(s) && s[j] == ' ' {
				j++
			}
			k := j
			for k < len(s) && !strings.ContainsRune(" \t\n;&|", rune(s[k])) {
				k++
			}
			t := s[j:k]
			if s[i] == '&' {
				t = "&" + t
			}
			if t == "" || t == "&" {
				return nil, fmt.Errorf("redirection without a target")
			}
			r.target = t
			cur.redir = append(cur.redir, r)
			i = k - 1
		case strings.IndexByte("|&`$(){}*?<\\", c) >= 0:
			if c == '$' && i+1 < len(s) && s[i+1] == '?' {
				word.WriteString("\x00?")
				inWord = true
				i++
				continue
			}
			return nil, fmt.Errorf("unsupported %q", c)
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	endCmd("")
	for _, c := range cmds {
		if len(c.words) > 0 && (c.words[0] == "while" || c.words[0] == "for" || c.words[0] == "if" || c.words[0] == "until" || c.words[0] == "case") {
			return nil, fmt.Errorf("unsupported %q", c.words[0])
		}
	}
	return cmds, nil
}
