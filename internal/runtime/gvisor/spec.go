package gvisor

import (
	"os"
	"path"
	"path/filepath"

	"github.com/airlock/airlock/internal/agentapi"
	"github.com/airlock/airlock/internal/runtime"
)

// The subset of the OCI runtime spec (v1.2) the driver writes. Only the
// fields runsc reads for a single-container sandbox are modelled.
type ociSpec struct {
	OCIVersion string     `json:"ociVersion"`
	Process    ociProcess `json:"process"`
	Root       ociRoot    `json:"root"`
	Hostname   string     `json:"hostname,omitempty"`
	Mounts     []ociMount `json:"mounts"`
	Linux      ociLinux   `json:"linux"`
}

type ociProcess struct {
	Terminal     bool            `json:"terminal"`
	User         ociUser         `json:"user"`
	Args         []string        `json:"args"`
	Env          []string        `json:"env"`
	Cwd          string          `json:"cwd"`
	Capabilities ociCapabilities `json:"capabilities"`
	Rlimits      []ociRlimit     `json:"rlimits,omitempty"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCapabilities struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Inheritable []string `json:"inheritable"`
	Permitted   []string `json:"permitted"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type,omitempty"`
	Source      string   `json:"source,omitempty"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	CgroupsPath string         `json:"cgroupsPath"`
	Resources   ociResources   `json:"resources"`
	Namespaces  []ociNamespace `json:"namespaces"`
}

type ociResources struct {
	Memory ociMemory `json:"memory"`
	CPU    ociCPU    `json:"cpu"`
	Pids   ociPids   `json:"pids"`
}

type ociMemory struct {
	Limit int64 `json:"limit"`
}

type ociCPU struct {
	Quota  int64  `json:"quota"`
	Period uint64 `json:"period"`
}

type ociPids struct {
	Limit int64 `json:"limit"`
}

type ociNamespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

// agentPath is where every template carries the in-guest agent.
const agentPath = "/usr/local/bin/airlock-agent"

// pidsLimit bounds the number of tasks in one sandbox.
const pidsLimit = 4096

const cpuPeriod = 100000

// capabilities is Docker's default set: enough for the agent to switch to the
// default user, chown files and signal its children.
var capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// buildSpec returns the OCI spec of one sandbox. chanDir is the host
// directory holding the agent socket.
func buildSpec(spec runtime.Spec, cgroupParent, chanDir string) ociSpec {
	o := baseSpec(spec, cgroupParent, chanDir)
	if spec.WritableRoot {
		// runsc mounts a tmpfs of its own over /tmp unless the spec has a
		// /tmp mount: a build step's files there would not reach the
		// tree (Docker keeps them). The tree's /tmp itself, bound, when it
		// is a real directory (never a symlink: the bind's source is
		// resolved on the host).
		tmp := filepath.Join(spec.RootFS, "tmp")
		if fi, err := os.Lstat(tmp); err == nil && fi.IsDir() {
			o.Mounts = append(o.Mounts, ociMount{Destination: "/tmp", Type: "bind", Source: tmp, Options: []string{"rbind", "rw"}})
		}
	}
	return o
}

func baseSpec(spec runtime.Spec, cgroupParent, chanDir string) ociSpec {
	hostname := spec.Hostname
	if hostname == "" {
		hostname = "sandbox"
	}
	return ociSpec{
		OCIVersion: "1.2.0",
		Process: ociProcess{
			User: ociUser{UID: 0, GID: 0},
			Args: append([]string{agentPath}, spec.AgentArgs...),
			Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cwd:  "/",
			Capabilities: ociCapabilities{
				Bounding: capabilities, Effective: capabilities,
				Inheritable: capabilities, Permitted: capabilities,
			},
			Rlimits: []ociRlimit{{Type: "RLIMIT_NOFILE", Hard: 65536, Soft: 65536}},
		},
		// readonly must be false: a read-only root disables the overlay and
		// every write fails. The template itself is never written: all
		// writes land in the --overlay2 upper layer (see runArgs).
		Root:     ociRoot{Path: spec.RootFS, Readonly: false},
		Hostname: hostname,
		Mounts: []ociMount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			// The channel directory. Read-only works: connect(2) on a socket
			// file needs no write access to the file system (verified with
			// --host-uds=open on this runsc version, see the conformance
			// suite's boot case), so the guest cannot create or replace
			// files in it.
			{Destination: agentapi.ChannelDir, Type: "bind", Source: chanDir, Options: []string{"rbind", "ro"}},
		},
		Linux: ociLinux{
			CgroupsPath: path.Join(cgroupParent, spec.ID),
			Resources: ociResources{
				Memory: ociMemory{Limit: int64(spec.MemoryMiB) << 20},
				CPU:    ociCPU{Quota: int64(spec.VCPUs) * cpuPeriod, Period: cpuPeriod},
				Pids:   ociPids{Limit: pidsLimit},
			},
			// No network namespace path: every sandbox gets its own, and
			// --network=none gives it gVisor's netstack with only loopback;
			// with one, the sandbox joins it (--network=sandbox).
			Namespaces: []ociNamespace{
				{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, {Type: "network", Path: spec.Network.Namespace},
			},
		},
	}
}
