package process

import (
	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/logfile"
)

// Logs returns the tail of the instance's output, at most limit bytes, as
// tail(1) shows several files: the end of stdout.log under a line
// "==> stdout <==", then the end of stderr.log under "==> stderr <==" (see
// logfile.Tail). It returns an error wrapping nodeexec.ErrNotFound for an
// instance that does not exist.
//
// Each log is capped at Options.LogMax by Running (for the instances that
// run) and by Start: past the cap, the newest half is kept.
func (d *Driver) Logs(name string, limit int) ([]byte, error) {
	if err := checkName("instance", name); err != nil {
		return nil, err
	}
	return nodeexec.InstanceLogs(name, d.instanceDir(name), limit)
}

// capLogs caps both of an instance's logs at d.logMax. A failure is logged,
// not returned: a log that cannot be cut must not stop the instance being
// seen or started.
func (d *Driver) capLogs(name string) {
	if err := logfile.CapAll(d.instanceDir(name), d.logMax); err != nil {
		d.log.Warn("capping an instance's log", "instance", name, "err", err)
	}
}
