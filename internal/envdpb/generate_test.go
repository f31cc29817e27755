package envdpb

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

var generated = []string{
	"process/process.pb.go",
	"process/processconnect/process.connect.go",
	"filesystem/filesystem.pb.go",
	"filesystem/filesystemconnect/filesystem.connect.go",
}

// toolVersions are the header lines naming the generator versions; a
// different protoc patch release must not fail the test.
var toolVersions = regexp.MustCompile(`(?m)^// (\s*protoc\s.*|- protoc\s.*|\tprotoc\s.*)$`)

// TestGenerated regenerates the code into a temporary directory and
// compares it with the committed files.
func TestGenerated(t *testing.T) {
	for _, tool := range []string{"protoc", "protoc-gen-go", "protoc-gen-connect-go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s in PATH (see generate.go for the install commands)", tool)
		}
	}
	out := t.TempDir()
	cmd := exec.Command("protoc", "-I", "../../api/proto",
		"--go_out="+out, "--go_opt=module=github.com/airlock/airlock/internal/envdpb",
		"--connect-go_out="+out, "--connect-go_opt=module=github.com/airlock/airlock/internal/envdpb",
		"process/process.proto", "filesystem/filesystem.proto")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, b)
	}
	for _, f := range generated {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatalf("protoc did not write %s: %v", f, err)
		}
		if !bytes.Equal(toolVersions.ReplaceAll(got, nil), toolVersions.ReplaceAll(want, nil)) {
			t.Errorf("%s is stale: run go generate ./internal/envdpb and commit the result", f)
		}
	}
}
