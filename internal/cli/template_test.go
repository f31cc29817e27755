package cli

import "testing"

func TestRefName(t *testing.T) {
	for ref, want := range map[string]string{
		"alpine":                        "alpine:latest",
		"docker.io/library/alpine:3.20": "alpine:3.20",
		"localhost:5000/team/App:v1":    "app:v1",
		"registry.example:5000/app":     "app:latest",
		"app@sha256:0123":               "",
		"registry.example/":             "",
	} {
		got, ok := refName(ref)
		if got != want || ok != (want != "") {
			t.Errorf("refName(%q) = %q, %v; want %q", ref, got, ok, want)
		}
	}
}
