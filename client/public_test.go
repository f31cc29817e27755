package client_test

import (
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"sort"
	"strings"
	"testing"
)

// TestPublicSurfaceNeedsNoInternal checks that a program outside the module
// can use everything package client exports without importing internal/:
// every named type from an internal package that its exported functions,
// methods, fields and types reach has an exported alias in client, and
// every exported constant of such a type (model.StateRunning, …) has a
// client constant of the same value. A new method returning, say,
// model.Foo fails here until client gets `Foo = model.Foo`.
func TestPublicSurfaceNeedsNoInternal(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP (-short): type-checks the client package and its imports from source (a few seconds)")
	}
	fset := token.NewFileSet()
	pkg, err := importer.ForCompiler(fset, "source", nil).Import("github.com/airlock/airlock/client")
	if err != nil {
		t.Fatalf("type-check the client package: %v", err)
	}
	scope := pkg.Scope()
	aliased := map[*types.TypeName]bool{}
	consts := map[string]bool{} // "type path.Name=value" of client's constants
	for _, name := range scope.Names() {
		switch obj := scope.Lookup(name).(type) {
		case *types.TypeName:
			if n, ok := types.Unalias(obj.Type()).(*types.Named); ok && obj.IsAlias() {
				aliased[n.Obj()] = true
			}
		case *types.Const:
			if obj.Exported() {
				consts[types.TypeString(obj.Type(), nil)+"="+obj.Val().ExactString()] = true
			}
		}
	}
	missing := map[string]string{} // internal type → where it was reached
	seen := map[types.Type]bool{}
	var visit func(t types.Type, from string)
	visit = func(t types.Type, from string) {
		t = types.Unalias(t)
		if seen[t] {
			return
		}
		seen[t] = true
		switch t := t.(type) {
		case *types.Named:
			obj := t.Obj()
			if obj.Pkg() != nil && strings.Contains(obj.Pkg().Path(), "/internal/") && !aliased[obj] {
				missing[obj.Pkg().Path()+"."+obj.Name()] = from
			}
			if args := t.TypeArgs(); args != nil {
				for i := range args.Len() {
					visit(args.At(i), from)
				}
			}
			if obj.Pkg() == nil || !strings.HasPrefix(obj.Pkg().Path(), "github.com/airlock/airlock") {
				return // the standard library's and other modules' types are public already
			}
			where := obj.Name()
			for i := range t.NumMethods() {
				if m := t.Method(i); m.Exported() {
					visit(m.Type(), where+"."+m.Name())
				}
			}
			visit(t.Underlying(), where)
		case *types.Pointer:
			visit(t.Elem(), from)
		case *types.Slice:
			visit(t.Elem(), from)
		case *types.Array:
			visit(t.Elem(), from)
		case *types.Map:
			visit(t.Key(), from)
			visit(t.Elem(), from)
		case *types.Chan:
			visit(t.Elem(), from)
		case *types.Signature:
			for i := range t.Params().Len() {
				visit(t.Params().At(i).Type(), from)
			}
			for i := range t.Results().Len() {
				visit(t.Results().At(i).Type(), from)
			}
		case *types.Struct:
			for i := range t.NumFields() {
				if f := t.Field(i); f.Exported() {
					visit(f.Type(), from+"."+f.Name())
				}
			}
		case *types.Interface:
			for i := range t.NumMethods() {
				if m := t.Method(i); m.Exported() {
					visit(m.Type(), from+"."+m.Name())
				}
			}
		}
	}
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if obj.Exported() {
			visit(obj.Type(), name)
		}
	}
	// The constants of the internal types the surface reaches.
	var missingConsts []string
	for obj := range aliased {
		if _, basic := obj.Type().Underlying().(*types.Basic); !basic {
			continue
		}
		ps := obj.Pkg().Scope()
		for _, name := range ps.Names() {
			c, ok := ps.Lookup(name).(*types.Const)
			if !ok || !c.Exported() || !types.Identical(c.Type(), obj.Type()) {
				continue
			}
			// In client's scope the alias prints as the internal type too.
			if !consts[types.TypeString(c.Type(), nil)+"="+c.Val().ExactString()] {
				missingConsts = append(missingConsts, obj.Pkg().Name()+"."+name+" ("+constant.StringVal(constant.MakeString(c.Val().ExactString()))+")")
			}
		}
	}
	var lines []string
	for typ, from := range missing {
		lines = append(lines, typ+" (reached from client."+from+")")
	}
	sort.Strings(lines)
	sort.Strings(missingConsts)
	if len(lines) > 0 {
		t.Errorf("package client exposes internal types a user outside the module cannot name; add an alias for each to client/types.go:\n  %s", strings.Join(lines, "\n  "))
	}
	if len(missingConsts) > 0 {
		t.Errorf("constants of aliased internal types without a client constant (add them to client/types.go):\n  %s", strings.Join(missingConsts, "\n  "))
	}
}

// TestExamplesUseOnlyThePublicPackage: the examples are what a user outside
// the module copies, so they import nothing from internal/ (inside the
// module the compiler would allow it).
func TestExamplesUseOnlyThePublicPackage(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "example_test.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range f.Imports {
		if strings.Contains(imp.Path.Value, "/internal/") {
			t.Errorf("example_test.go imports %s; examples must use package client alone", imp.Path.Value)
		}
	}
	if len(f.Imports) == 0 {
		t.Fatal("example_test.go has no imports; did it move?")
	}
}
