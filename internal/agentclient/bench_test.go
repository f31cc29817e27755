package agentclient_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"github.com/airlock/airlock/internal/agentapi"
)

// BenchmarkExecTrue measures start + full output stream of `true`.
func BenchmarkExecTrue(b *testing.B) {
	h := startAgent(b)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		i++
		id := fmt.Sprintf("bench-true-%d", i)
		if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", Cwd: "/", Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		s, err := h.client.Output(ctx, id, 0)
		if err != nil {
			b.Fatal(err)
		}
		for {
			kind, _, err := s.Next()
			if err != nil {
				b.Fatal(err)
			}
			if kind == agentapi.FrameExit {
				break
			}
		}
		s.Close()
	}
}

const benchFileSize = 64 << 20

func BenchmarkFileWrite(b *testing.B) {
	h := startAgent(b)
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "f")
	data := make([]byte, benchFileSize)
	b.SetBytes(benchFileSize)
	for b.Loop() {
		if _, err := h.client.WriteFile(ctx, path, "", "root", bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFileRead(b *testing.B) {
	h := startAgent(b)
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "f")
	if _, err := h.client.WriteFile(ctx, path, "", "root", bytes.NewReader(make([]byte, benchFileSize))); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	b.SetBytes(benchFileSize)
	for b.Loop() {
		rc, _, err := h.client.ReadFile(ctx, path)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, rc, buf)
		rc.Close()
		if err != nil || n != benchFileSize {
			b.Fatalf("read %d bytes: %v", n, err)
		}
	}
}

// BenchmarkOutput measures streaming 64 MiB of process output.
func BenchmarkOutput(b *testing.B) {
	h := startAgent(b)
	ctx := context.Background()
	b.SetBytes(benchFileSize)
	i := 0
	for b.Loop() {
		i++
		id := fmt.Sprintf("bench-out-%d", i)
		if _, err := h.client.StartProcess(ctx, agentapi.ProcessSpec{ID: id, User: "root", Cwd: "/",
			Argv: []string{"head", "-c", fmt.Sprint(benchFileSize), "/dev/zero"}}); err != nil {
			b.Fatal(err)
		}
		s, err := h.client.Output(ctx, id, 0)
		if err != nil {
			b.Fatal(err)
		}
		var n int
		for {
			kind, p, err := s.Next()
			if err != nil {
				b.Fatal(err)
			}
			n += len(p)
			if kind == agentapi.FrameExit {
				break
			}
		}
		s.Close()
	}
}
