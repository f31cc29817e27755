// Command probe is the one program of the e2e tests' imported OCI image
// (which has no shell): it prints who and where it runs, and what the tree
// holds at the paths it is given, in lines a test compares exactly.
//
//	probe id          uid=N gid=N cwd=DIR
//	probe env NAME…   NAME=value (or NAME unset) per line
//	probe stat PATH…  PATH TYPE MODE UID:GID [-> TARGET | "content"] [ino=N] per line; PATH missing
package main

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe id | env NAME… | stat PATH…")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "id":
		wd, _ := os.Getwd()
		fmt.Printf("uid=%d gid=%d cwd=%s\n", os.Getuid(), os.Getgid(), wd)
	case "env":
		for _, n := range os.Args[2:] {
			if v, ok := os.LookupEnv(n); ok {
				fmt.Printf("%s=%s\n", n, v)
			} else {
				fmt.Printf("%s unset\n", n)
			}
		}
	case "stat":
		for _, p := range os.Args[2:] {
			fi, err := os.Lstat(p)
			if err != nil {
				fmt.Printf("%s missing\n", p)
				continue
			}
			st := fi.Sys().(*syscall.Stat_t)
			line := fmt.Sprintf("%s %s %04o %d:%d", p, kind(fi.Mode()), st.Mode&0o7777, st.Uid, st.Gid)
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				t, _ := os.Readlink(p)
				line += " -> " + t
			case fi.Mode().IsRegular():
				b, _ := os.ReadFile(p)
				line += fmt.Sprintf(" %q ino=%d", b, st.Ino)
			}
			fmt.Println(line)
		}
	default:
		fmt.Fprintf(os.Stderr, "probe: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

func kind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "other"
}
