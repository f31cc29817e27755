//go:build ignore

// Added to gVisor's runsc/boot/filter/config package (through a build
// overlay) while runsc is built, so that the generator (gen.go) can
// precompile the sentry's seccomp program for the configurations Airlock
// runs, which is what gVisor's Bazel build does for every configuration.
package config

import (
	"gvisor.dev/gvisor/pkg/seccomp"
	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
)

// AirlockPrecompile precompiles the sentry's program for each option set
// gVisor would precompile that keep accepts.
func AirlockPrecompile(keep func(Options) bool) ([]precompiledseccomp.Program, error) {
	all, err := optionsToPrecompile()
	if err != nil {
		return nil, err
	}
	var out []precompiledseccomp.Program
	for _, opt := range all {
		if !keep(opt) {
			continue
		}
		var varNames []string
		for name := range opt.Vars() {
			varNames = append(varNames, name)
		}
		p, err := precompiledseccomp.Precompile(opt.ConfigKey(), varNames, func(vars precompiledseccomp.Values) *seccomp.Program {
			allow, deny := rules(opt, vars)
			return &seccomp.Program{
				RuleSets: []seccomp.RuleSet{
					{Rules: deny.Copy()},
					{Rules: allow.Copy(), Action: seccomp.Allow},
				},
				Options: SeccompOptions(opt),
			}
		})
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}
