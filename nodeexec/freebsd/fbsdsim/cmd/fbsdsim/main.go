// Command fbsdsim is the simulator's multi-call binary: installed under
// the names of FreeBSD's commands (fbsdsim.Install), it acts as each of
// them on the state under $KEEL_FBSDSIM_ROOT.
package main

import (
	"os"

	"github.com/keel-dev/keel/nodeexec/freebsd/fbsdsim"
)

func main() {
	os.Exit(fbsdsim.Main(os.Args, os.Stdout, os.Stderr))
}
