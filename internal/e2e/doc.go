// Package e2e holds Airlock's end-to-end tests: they build the real binaries,
// run `airlock server` and `airlock worker` as separate processes (the server
// over PostgreSQL when AIRLOCK_TEST_POSTGRES_URL is set, else SQLite) and
// `airlock up`, and drive them through the Go client exactly as a user would,
// against real runsc sandboxes. They need root; without it they skip and say
// so.
package e2e
