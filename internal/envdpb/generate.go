// Package envdpb holds the Go code generated from Airlock's envd-compatible
// protobuf definitions in api/proto: the messages (package process,
// filesystem) and the connect-go clients and handlers (processconnect,
// filesystemconnect). The generated files are committed; regenerate after
// editing a .proto with `go generate ./internal/envdpb`, which needs:
//
//	apt-get install -y protobuf-compiler   # protoc (Debian 12: 3.21.12)
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
//
// TestGenerated fails when the committed files differ from a fresh run.
package envdpb

//go:generate protoc -I ../../api/proto --go_out=. --go_opt=module=github.com/airlock/airlock/internal/envdpb --connect-go_out=. --connect-go_opt=module=github.com/airlock/airlock/internal/envdpb process/process.proto filesystem/filesystem.proto
