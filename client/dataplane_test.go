package client

import (
	"testing"
	"time"

	"github.com/airlock/airlock/internal/token"
)

func TestFilesClientEndpoint(t *testing.T) {
	tok, err := token.Sign(token.NewKey(), token.Claims{SandboxID: "sb-tok", Scope: token.ScopeFiles, Expires: time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		fc   FilesClient
		want string
	}{
		{"worker base, id from token", FilesClient{URL: "http://w:1", Token: tok}, "http://w:1/v1/sandboxes/sb-tok/files/stat?path=%2Fx"},
		{"worker base, explicit id", FilesClient{URL: "http://w:1/", SandboxID: "sb-x", Token: tok}, "http://w:1/v1/sandboxes/sb-x/files/stat?path=%2Fx"},
		{"sandbox base", FilesClient{URL: "http://w:1/v1/sandboxes/sb-a", Token: tok}, "http://w:1/v1/sandboxes/sb-a/files/stat?path=%2Fx"},
		{"files session url", FilesClient{URL: "http://w:1/v1/sandboxes/sb-a/files/", Token: tok}, "http://w:1/v1/sandboxes/sb-a/files/stat?path=%2Fx"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.fc.endpoint("/stat", map[string][]string{"path": {"/x"}})
			if err != nil || got != tc.want {
				t.Fatalf("endpoint = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := (&FilesClient{URL: "http://w:1", Token: "garbage"}).endpoint("/stat", nil); err == nil {
		t.Fatal("no sandbox id: want an error")
	}
}
