package fbsdsim

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// RootEnv names the environment variable that gives the executables the
// simulator's root.
const RootEnv = "KEEL_FBSDSIM_ROOT"

// StopTimeoutEnv, when set (a Go duration), overrides jail -r's stop
// timeout for the executables.
const StopTimeoutEnv = "KEEL_FBSDSIM_STOP_TIMEOUT"

// Main is the multi-call executable: it acts as the command named by
// filepath.Base(args[0]) on the state under $KEEL_FBSDSIM_ROOT and
// returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	root := os.Getenv(RootEnv)
	if root == "" {
		fmt.Fprintf(stderr, "fbsdsim: %s is not set\n", RootEnv)
		return 70
	}
	var o Options
	if d, err := time.ParseDuration(os.Getenv(StopTimeoutEnv)); err == nil {
		o.StopTimeout = d
	}
	s := OnDisk(root, o)
	argv := append([]string{filepath.Base(args[0])}, args[1:]...)
	if argv[0] == "jexec" {
		return s.JexecMain(argv, stdout, stderr)
	}
	if _, ok := handlers[argv[0]]; !ok && argv[0] != "jail" {
		fmt.Fprintf(stderr, "fbsdsim: %s: not a command the simulator models\n", strconv.Quote(argv[0]))
		return 127
	}
	return s.exec(argv, "", stdout, stderr)
}
