package gvisor

// RunscCommand is runsc and its global flags, for running runsc subcommands
// against d's sandboxes.
func RunscCommand(d *Driver) (string, []string) { return d.cfg.RunscPath, d.globalArgs() }
