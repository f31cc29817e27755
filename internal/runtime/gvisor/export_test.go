package gvisor

// UseFreezer switches Pause between the cgroup freezer (on, when the host
// has one: Config.FreezerPause) and runsc pause (off, the default).
func UseFreezer(d *Driver, on bool) {
	d.cfg.FreezerPause = on
	d.freezerRoot, _ = findFreezer()
}

// FreezerDir is the sandbox's cgroup in the freezer hierarchy ("" without
// one).
func FreezerDir(d *Driver, id string) string { return d.freezerDir(id) }

// RunscCommand is runsc and its global flags, for running runsc subcommands
// against d's sandboxes.
func RunscCommand(d *Driver) (string, []string) { return d.cfg.RunscPath, d.globalArgs() }
