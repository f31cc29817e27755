package cli

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock/airlock/internal/agentapi"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		raw     bool
		wantPos []string
		wantD   bool
		wantCwd string
		wantErr bool
	}{
		{name: "flags first", args: []string{"-d", "sb-1"}, wantPos: []string{"sb-1"}, wantD: true},
		{name: "flags after positional", args: []string{"sb-1", "-d", "--cwd", "/x"}, wantPos: []string{"sb-1"}, wantD: true, wantCwd: "/x"},
		{name: "interspersed", args: []string{"a", "-d", "b"}, wantPos: []string{"a", "b"}, wantD: true},
		{name: "dash dash ends flags", args: []string{"a", "--", "-d"}, wantPos: []string{"a", "-d"}},
		{name: "unknown flag", args: []string{"--nope"}, wantErr: true},
		{name: "raw: command after dash dash", raw: true, args: []string{"-d", "sb-1", "--", "sh", "-c", "exit 7"}, wantPos: []string{"sb-1", "sh", "-c", "exit 7"}, wantD: true},
		{name: "raw: flags between id and dash dash", raw: true, args: []string{"sb-1", "-d", "--", "ls", "-l"}, wantPos: []string{"sb-1", "ls", "-l"}, wantD: true},
		{name: "raw: command without dash dash keeps its flags", raw: true, args: []string{"sb-1", "ls", "-d"}, wantPos: []string{"sb-1", "ls", "-d"}},
		{name: "raw: dash dash inside the command stays", raw: true, args: []string{"sb-1", "--", "echo", "--", "x"}, wantPos: []string{"sb-1", "echo", "--", "x"}},
		{name: "raw: only the id", raw: true, args: []string{"sb-1"}, wantPos: []string{"sb-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(new(bytes.Buffer))
			d := fs.Bool("d", false, "")
			cwd := fs.String("cwd", "", "")
			pos, err := parseArgs(fs, tt.args, tt.raw)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if !slices.Equal(pos, tt.wantPos) || *d != tt.wantD || *cwd != tt.wantCwd {
				t.Errorf("got pos %q d=%v cwd=%q; want %q d=%v cwd=%q", pos, *d, *cwd, tt.wantPos, tt.wantD, tt.wantCwd)
			}
		})
	}
}

func TestParseLocation(t *testing.T) {
	tests := []struct {
		in      string
		want    Location
		wantErr bool
	}{
		{in: "sb-abc:/home/user/x", want: Location{SandboxID: "sb-abc", Path: "/home/user/x"}},
		{in: "sb-abc:rel/path", want: Location{SandboxID: "sb-abc", Path: "rel/path"}},
		{in: "sb-abc:/a:b", want: Location{SandboxID: "sb-abc", Path: "/a:b"}},
		{in: "/tmp/file", want: Location{Path: "/tmp/file"}},
		{in: "-", want: Location{Path: "-"}},
		{in: "./sb-abc:x", want: Location{Path: "./sb-abc:x"}},
		{in: "dir/sb-abc:x", want: Location{Path: "dir/sb-abc:x"}},
		{in: "notes:2024", want: Location{Path: "notes:2024"}},
		{in: "sb-abc:", wantErr: true},
		{in: "sb-:/x", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseLocation(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseLocation(%q) err = %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseLocation(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

func TestExitStatusOf(t *testing.T) {
	tests := []struct {
		exit agentapi.Exit
		want int
	}{
		{agentapi.Exit{ExitCode: 0}, 0},
		{agentapi.Exit{ExitCode: 7}, 7},
		{agentapi.Exit{ExitCode: 255}, 255},
		{agentapi.Exit{ExitCode: -1, Signal: "KILL"}, 128 + int(syscall.SIGKILL)},
		{agentapi.Exit{ExitCode: -1, Signal: "TERM"}, 128 + int(syscall.SIGTERM)},
		{agentapi.Exit{ExitCode: -1, Signal: "SIGINT"}, 128 + int(syscall.SIGINT)},
		{agentapi.Exit{ExitCode: -1, Signal: "9"}, 137},
		{agentapi.Exit{ExitCode: -1, Signal: "KILL", TimedOut: true}, 137},
		{agentapi.Exit{ExitCode: -1}, ExitError},
	}
	for _, tt := range tests {
		if got := ExitStatusOf(tt.exit); got != tt.want {
			t.Errorf("ExitStatusOf(%+v) = %d, want %d", tt.exit, got, tt.want)
		}
	}
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{&ExitCodeError{Code: 42}, 42},
		{usagef("x", "bad"), ExitUsage},
		{flag.ErrHelp, ExitUsage},
		{os.ErrNotExist, ExitError},
	}
	for _, tt := range tests {
		if got := ExitCode(tt.err); got != tt.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
}

func TestSignalName(t *testing.T) {
	for sig, want := range map[os.Signal]string{syscall.SIGINT: "INT", syscall.SIGTERM: "TERM", os.Interrupt: "INT"} {
		if got := signalName(sig); got != want {
			t.Errorf("signalName(%v) = %q, want %q", sig, got, want)
		}
	}
}

func TestLoadConfig(t *testing.T) {
	dataDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dataDir, AdminKeyFile), []byte("al_filekey\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir() // no key under ~/.local/share/airlock
	homeWithKey := t.TempDir()
	if err := os.MkdirAll(filepath.Join(homeWithKey, defaultDataSub), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(homeWithKey, defaultDataSub, AdminKeyFile), []byte("al_homekey"), 0o600); err != nil {
		t.Fatal(err)
	}
	emptyDir := t.TempDir()
	os.WriteFile(filepath.Join(emptyDir, AdminKeyFile), []byte("  \n"), 0o600)

	tests := []struct {
		name             string
		env              map[string]string
		urlFlag, keyFlag string
		want             Config
		wantErr          string
	}{
		{name: "flags win", env: map[string]string{envURL: "http://env:1", envAPIKey: "envkey"}, urlFlag: "http://flag:2/", keyFlag: "flagkey",
			want: Config{URL: "http://flag:2", APIKey: "flagkey"}},
		{name: "env", env: map[string]string{envURL: "http://env:1", envAPIKey: "envkey", envDataDir: dataDir},
			want: Config{URL: "http://env:1", APIKey: "envkey"}},
		{name: "data dir key file and default url", env: map[string]string{envDataDir: dataDir},
			want: Config{URL: DefaultURL, APIKey: "al_filekey"}},
		{name: "home default data dir", env: map[string]string{"HOME": homeWithKey},
			want: Config{URL: DefaultURL, APIKey: "al_homekey"}},
		{name: "no key anywhere", env: map[string]string{"HOME": home}, wantErr: "no API key"},
		{name: "empty key file", env: map[string]string{envDataDir: emptyDir}, wantErr: "is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			got, err := LoadConfig(getenv, tt.urlFlag, tt.keyFlag)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestKVFlag(t *testing.T) {
	m := kvFlag{}
	for _, s := range []string{"A=1", "B=x=y", "C="} {
		if err := m.Set(s); err != nil {
			t.Fatalf("Set(%q): %v", s, err)
		}
	}
	if got := m.String(); got != "A=1,B=x=y,C=" {
		t.Errorf("String() = %q", got)
	}
	for _, bad := range []string{"noequals", "=v"} {
		if err := m.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}

// runMain runs Main with an environment that has no API key reachable.
func runMain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	home := t.TempDir()
	code = Main(context.Background(), args, Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		if k == "HOME" {
			return home
		}
		return ""
	}})
	return code, out.String(), errb.String()
}

func TestMainUsage(t *testing.T) {
	tests := []struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{args: nil, wantCode: ExitUsage, wantStderr: "no command given"},
		{args: []string{"help"}, wantCode: 0, wantStdout: "sandbox create"},
		{args: []string{"--help"}, wantCode: 0, wantStdout: "Commands:"},
		{args: []string{"help", "exec"}, wantCode: 0, wantStdout: "Usage: airlock exec"},
		{args: []string{"exec", "-h"}, wantCode: 0, wantStdout: "-timeout"},
		{args: []string{"sandbox", "create", "--help"}, wantCode: 0, wantStdout: "-idempotency-key"},
		{args: []string{"sandbox", "list", "-h"}, wantCode: 0, wantStdout: "Usage: airlock sandbox ls"},
		{args: []string{"frobnicate"}, wantCode: ExitUsage, wantStderr: `unknown command "frobnicate"`},
		{args: []string{"sandbox"}, wantCode: ExitUsage, wantStderr: "sandbox needs a subcommand"},
		{args: []string{"sandbox", "explode"}, wantCode: ExitUsage, wantStderr: "unknown command"},
		{args: []string{"sandbox", "get"}, wantCode: ExitUsage, wantStderr: "want exactly one sandbox id"},
		{args: []string{"sandbox", "create", "--vcpus", "many"}, wantCode: ExitUsage, wantStderr: "invalid value"},
		{args: []string{"sandbox", "create", "--env", "NOEQ"}, wantCode: ExitUsage, wantStderr: "not KEY=VALUE"},
		{args: []string{"sandbox", "ls", "--state", "sleepy"}, wantCode: ExitUsage, wantStderr: `unknown state "sleepy"`},
		{args: []string{"exec"}, wantCode: ExitUsage, wantStderr: "want a sandbox id and a command"},
		{args: []string{"cp", "a", "b"}, wantCode: ExitUsage, wantStderr: "exactly one of source and destination"},
		{args: []string{"cp", "sb-1:/a", "sb-2:/b"}, wantCode: ExitUsage, wantStderr: "exactly one of source and destination"},
		{args: []string{"key", "create"}, wantCode: ExitUsage, wantStderr: "--org is required"},
		{args: []string{"bench", "--iterations", "0"}, wantCode: ExitUsage, wantStderr: "--iterations must be positive"},
		{args: []string{"bench", "--only", "create,naps"}, wantCode: ExitUsage, wantStderr: `unknown group "naps"`},
		{args: []string{"bench", "--suspend-mib", "16,x"}, wantCode: ExitUsage, wantStderr: "--suspend-mib"},
		{args: []string{"bench", "--pool-runs", "0"}, wantCode: ExitUsage, wantStderr: "--pool-runs must be positive"},
		{args: []string{"bench", "--egress-runs", "0"}, wantCode: ExitUsage, wantStderr: "--egress-runs must be positive"},
		// The egress group needs no API (and this test binary has no egress bench).
		{args: []string{"bench", "--only", "egress"}, wantCode: 0, wantStdout: "no egress bench", wantStderr: "egress: SKIPPED"},
		{args: []string{"pool", "set", "base"}, wantCode: ExitUsage, wantStderr: "want <template> <size>"},
		{args: []string{"pool", "rm"}, wantCode: ExitUsage, wantStderr: "exactly one template"},
		{args: []string{"up"}, wantCode: ExitUsage, wantStderr: "daemon command"},
		// Well-formed commands without an API key fail (1), saying what to do.
		{args: []string{"sandbox", "ls"}, wantCode: ExitError, wantStderr: "no API key: set $AIRLOCK_API_KEY"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, out, errOut := runMain(t, tt.args...)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tt.wantCode, errOut)
			}
			if !strings.Contains(out, tt.wantStdout) {
				t.Errorf("stdout %q does not contain %q", out, tt.wantStdout)
			}
			if !strings.Contains(errOut, tt.wantStderr) {
				t.Errorf("stderr %q does not contain %q", errOut, tt.wantStderr)
			}
		})
	}
}

func TestEveryCommandHasHelp(t *testing.T) {
	for _, c := range commands {
		code, out, errOut := runMain(t, append(strings.Fields(c.name), "-h")...)
		if code != 0 || !strings.Contains(out, "Usage: airlock "+c.name) {
			t.Errorf("%s -h: code %d, stdout %q, stderr %q", c.name, code, out, errOut)
		}
	}
}
