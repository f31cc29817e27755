package envd_test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/airlock/airlock/internal/agent"
	"github.com/airlock/airlock/internal/agent/envd"
	fspb "github.com/airlock/airlock/internal/envdpb/filesystem"
	"github.com/airlock/airlock/internal/envdpb/filesystem/filesystemconnect"
	procpb "github.com/airlock/airlock/internal/envdpb/process"
	"github.com/airlock/airlock/internal/envdpb/process/processconnect"
	"github.com/airlock/airlock/internal/testenv"
)

// fuzzRPC is one envd procedure the codec fuzzer drives. Only procedures
// that change nothing on the machine are listed (the fuzzer runs as root
// on the host): reads, and actions on processes and watchers that do not
// exist in a fresh agent.
type fuzzRPC struct {
	procedure string
	stream    bool          // a streaming procedure: Connect envelopes
	seed      proto.Message // a valid request
}

var fuzzRPCs = []fuzzRPC{
	{filesystemconnect.FilesystemStatProcedure, false, &fspb.StatRequest{Path: "/etc/hostname"}},
	{filesystemconnect.FilesystemGetWatcherEventsProcedure, false, &fspb.GetWatcherEventsRequest{WatcherId: "w-1"}},
	{filesystemconnect.FilesystemRemoveWatcherProcedure, false, &fspb.RemoveWatcherRequest{WatcherId: "w-1"}},
	{processconnect.ProcessListProcedure, false, &procpb.ListRequest{}},
	{processconnect.ProcessSendSignalProcedure, false, &procpb.SendSignalRequest{
		Process: &procpb.ProcessSelector{Selector: &procpb.ProcessSelector_Pid{Pid: 4242}}, Signal: procpb.Signal_SIGNAL_SIGTERM}},
	{processconnect.ProcessSendInputProcedure, false, &procpb.SendInputRequest{
		Process: &procpb.ProcessSelector{Selector: &procpb.ProcessSelector_Tag{Tag: "t"}},
		Input:   &procpb.ProcessInput{Input: &procpb.ProcessInput_Stdin{Stdin: []byte("x")}}}},
	{processconnect.ProcessUpdateProcedure, false, &procpb.UpdateRequest{
		Process: &procpb.ProcessSelector{Selector: &procpb.ProcessSelector_Pid{Pid: 4242}}, Pty: &procpb.PTY{Size: &procpb.PTY_Size{Cols: 80, Rows: 24}}}},
	{processconnect.ProcessCloseStdinProcedure, false, &procpb.CloseStdinRequest{
		Process: &procpb.ProcessSelector{Selector: &procpb.ProcessSelector_Pid{Pid: 4242}}}},
	{processconnect.ProcessConnectProcedure, true, &procpb.ConnectRequest{
		Process: &procpb.ProcessSelector{Selector: &procpb.ProcessSelector_Tag{Tag: "t"}}}},
	{processconnect.ProcessStreamInputProcedure, true, &procpb.StreamInputRequest{
		Event: &procpb.StreamInputRequest_Start{Start: &procpb.StreamInputRequest_StartEvent{
			Process: &procpb.ProcessSelector{Selector: &procpb.ProcessSelector_Pid{Pid: 4242}}}}}},
}

// The codecs a client can pick by Content-Type.
const (
	codecProto = iota
	codecJSON
	numCodecs
)

// envelope frames msg as one Connect stream message (flags, big-endian
// length, payload).
func envelope(flags byte, msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// wellFramed reports whether body is a sequence of uncompressed Connect
// envelopes (exactly one when single). Connect and gRPC call a framing
// error "internal"; for a well-framed request an internal error is envd's.
func wellFramed(body []byte, single bool) bool {
	n := 0
	for len(body) > 0 {
		if len(body) < 5 || body[0] != 0 {
			return false
		}
		size := int(binary.BigEndian.Uint32(body[1:5]))
		if 5+size > len(body) {
			return false
		}
		body = body[5+size:]
		n++
	}
	return !single || n == 1
}

// FuzzConnectCodecs sends arbitrary bodies, in every codec envd accepts
// (proto and JSON, unary and enveloped streams), with an arbitrary user
// header, to the agent's real envd handler: the decoders that read what a
// client (or anyone holding the envd token) sends. It must never panic,
// and malformed input is the caller's error, never an internal one: no
// 5xx for a unary call and no "internal"/"unknown" end of a well-framed
// stream (the Connect protocol itself calls framing errors internal).
func FuzzConnectCodecs(f *testing.F) {
	testenv.RequireRoot(f, "the agent acts for users by uid, as it does as a guest's init")
	a := agent.New(agent.Config{})
	h := envd.New(a, envd.Config{})
	for i, rpc := range fuzzRPCs {
		pb, err := proto.Marshal(rpc.seed)
		if err != nil {
			f.Fatal(err)
		}
		js, err := protojson.Marshal(rpc.seed)
		if err != nil {
			f.Fatal(err)
		}
		if rpc.stream {
			pb, js = envelope(0, pb), envelope(0, js)
		}
		f.Add(uint8(i), uint8(codecProto), "", pb)
		f.Add(uint8(i), uint8(codecJSON), "", js)
		f.Add(uint8(i), uint8(codecJSON), "root", js)
		f.Add(uint8(i), uint8(codecProto), "nobody:", pb)
	}
	f.Add(uint8(0), uint8(codecJSON), "", []byte(`{"path":"~nobody/x"}`))
	f.Add(uint8(0), uint8(codecJSON), "", []byte(`{"path":"/etc/\u0000"}`))
	f.Add(uint8(0), uint8(codecProto), "", []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add(uint8(8), uint8(codecProto), "", envelope(1, []byte("not gzip")))
	f.Add(uint8(9), uint8(codecProto), "", append(envelope(0, nil), 0x02, 0xff, 0xff, 0xff))

	f.Fuzz(func(t *testing.T, which, codec uint8, userName string, body []byte) {
		rpc := fuzzRPCs[int(which)%len(fuzzRPCs)]
		ct := "application/"
		if rpc.stream {
			ct += "connect+"
		}
		if codec%numCodecs == codecJSON {
			ct += "json"
		} else {
			ct += "proto"
		}
		req := httptest.NewRequest(http.MethodPost, rpc.procedure, bytes.NewReader(body))
		req.Header.Set("Content-Type", ct)
		if !rpc.stream {
			req.Header.Set("Connect-Protocol-Version", "1")
		}
		if userName != "" {
			req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(userName)))
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		if !rpc.stream {
			if rec.Code >= 500 && rec.Code != http.StatusNotImplemented {
				t.Fatalf("%s (%s) = %d for a malformed request, want a 4xx: %s", rpc.procedure, ct, rec.Code, rec.Body.Bytes())
			}
			return
		}
		// A stream ends with an end-of-stream envelope (flag 0x02) whose
		// JSON names the error, if any.
		out := rec.Body.Bytes()
		for len(out) >= 5 {
			n := int(binary.BigEndian.Uint32(out[1:5]))
			if 5+n > len(out) {
				t.Fatalf("%s: truncated response envelope", rpc.procedure)
			}
			if out[0]&0x02 != 0 {
				var end struct {
					Error *struct{ Code, Message string } `json:"error"`
				}
				if err := json.Unmarshal(out[5:5+n], &end); err != nil {
					t.Fatalf("%s: end of stream is not JSON: %q", rpc.procedure, out[5:5+n])
				}
				if end.Error != nil && (end.Error.Code == "internal" || end.Error.Code == "unknown") &&
					wellFramed(body, rpc.procedure == processconnect.ProcessConnectProcedure) {
					t.Fatalf("%s (%s): %s error for a malformed request: %s", rpc.procedure, ct, end.Error.Code, end.Error.Message)
				}
			}
			out = out[5+n:]
		}
		if len(out) != 0 && !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
			t.Fatalf("%s: %d trailing bytes after the last envelope", rpc.procedure, len(out))
		}
	})
}
