package client_test

// The examples need a running Airlock (AIRLOCK_URL, AIRLOCK_API_KEY), so
// they are compiled, not run, by go test; internal/e2e runs the same calls
// against a real stack (TestConformanceGo over sdk/conformance).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/airlock/airlock/client"
)

// Create a sandbox, run a command in it, and delete it.
func Example() {
	ctx := context.Background()
	c := client.New(os.Getenv("AIRLOCK_URL"), os.Getenv("AIRLOCK_API_KEY"))

	sb, op, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{
		Template:  "base",
		Resources: client.Resources{VCPUs: 1, MemoryMiB: 512},
		Metadata:  map[string]string{"job": "example"},
	}, "")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		log.Fatal(err) // an *OperationError says why the create failed
	}
	defer func() {
		if op, err := c.DeleteSandbox(ctx, sb.ID); err == nil {
			c.WaitOperation(ctx, op.ID)
		}
	}()

	cmd, err := c.CreateCommand(ctx, sb.ID, client.CreateCommandRequest{Cmd: "echo hello; exit 3"})
	if err != nil {
		log.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	exit, err := client.RunCommand(ctx, cmd.AttachURL, cmd.Token, nil, &stdout, &stderr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit %d: %s", exit.ExitCode, stdout.String()) // exit 3: hello
}

// Write a file into a sandbox, read it back and list its directory.
func ExampleFilesClient() {
	ctx := context.Background()
	c := client.New(os.Getenv("AIRLOCK_URL"), os.Getenv("AIRLOCK_API_KEY"))
	files, err := c.Files(ctx, "sb-…")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := files.Write(ctx, "/home/user/notes.txt", strings.NewReader("hi\n"), "0644", ""); err != nil {
		log.Fatal(err)
	}
	rc, err := files.Read(ctx, "/home/user/notes.txt")
	if err != nil {
		log.Fatal(err)
	}
	defer rc.Close()
	entries, err := files.List(ctx, "/home/user")
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range entries {
		fmt.Println(e.Name, e.Type, e.Size)
	}
}

// Suspend a sandbox (a durable snapshot; its resources are released) and
// wake it again; a lifecycle request the state does not allow is a
// conflict.
func ExampleClient_SuspendSandbox() {
	ctx := context.Background()
	c := client.New(os.Getenv("AIRLOCK_URL"), os.Getenv("AIRLOCK_API_KEY"))
	op, err := c.SuspendSandbox(ctx, "sb-…")
	if errors.Is(err, client.ErrConflict) {
		log.Fatalf("cannot suspend now: %v", err) // the message says why
	} else if err != nil {
		log.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		log.Fatal(err)
	}
	if op, err = c.WakeSandbox(ctx, "sb-…"); err == nil {
		_, err = c.WaitOperation(ctx, op.ID)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// Follow a sandbox's events (server-sent events, resumed after a dropped
// connection) until it is deleted.
func ExampleClient_Events() {
	ctx := context.Background()
	c := client.New(os.Getenv("AIRLOCK_URL"), os.Getenv("AIRLOCK_API_KEY"))
	for ev, err := range c.Events(ctx, "sb-…", 0) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ev.Seq, ev.Type)
		if ev.Type == "sandbox.state" && strings.Contains(string(ev.Data), `"state":"deleted"`) {
			return
		}
	}
}

// Run a command on a pseudo-terminal (what `airlock exec -it` does): the
// output is one stream, keys go in as stdin, and the size can change.
func ExampleCommandSession_Resize() {
	ctx := context.Background()
	c := client.New(os.Getenv("AIRLOCK_URL"), os.Getenv("AIRLOCK_API_KEY"))
	cmd, err := c.CreateCommand(ctx, "sb-…", client.CreateCommandRequest{
		Argv: []string{"bash"}, PTY: &client.PTYSize{Cols: 80, Rows: 24}})
	if err != nil {
		log.Fatal(err)
	}
	sess, err := client.AttachCommand(ctx, cmd.AttachURL, cmd.Token, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close()
	sess.Resize(120, 40)
	sess.WriteStdin([]byte("stty size; exit\r"))
	for {
		kind, payload, err := sess.Next()
		if err != nil {
			log.Fatal(err)
		}
		os.Stdout.Write(payload)
		if kind == client.FrameExit {
			return
		}
	}
}
