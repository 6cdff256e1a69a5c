package nodeexec

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/keel-dev/keel/nodeexec/logfile"
)

// InstanceLogs is Instances.Logs for a driver that keeps instance name's
// output in dir with package logfile: the tail of its stdout and stderr
// (logfile.Tail), or an error wrapping ErrNotFound when dir does not exist.
// The caller has checked name.
func InstanceLogs(name, dir string, limit int) ([]byte, error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("logs %s: %w", name, ErrNotFound)
	}
	b, err := logfile.Tail(dir, limit)
	if err != nil {
		return nil, fmt.Errorf("logs %s: %w", name, err)
	}
	return b, nil
}
