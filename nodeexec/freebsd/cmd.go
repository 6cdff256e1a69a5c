package freebsd

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// cmdTimeout bounds one command, whatever the caller's context allows: a
// command that hangs (a wedged zfs, a jail -r waiting on a stuck process)
// must not hold an instance's lock for ever.
const cmdTimeout = 2 * time.Minute

// cmdError is a command that ran and exited non-zero.
type cmdError struct {
	argv   []string
	code   int
	stderr string
}

func (e *cmdError) Error() string {
	msg := strings.TrimSpace(e.stderr)
	if msg == "" {
		msg = "no message"
	}
	return fmt.Sprintf("%s: exit status %d: %s", strings.Join(e.argv, " "), e.code, msg)
}

// has reports whether the command's message contains any of substrs.
func (e *cmdError) has(substrs ...string) bool {
	for _, s := range substrs {
		if strings.Contains(e.stderr, s) {
			return true
		}
	}
	return false
}

// run runs argv and returns its result; err is only for a command that
// could not run (or ran out of time).
func (d *Driver) run(ctx context.Context, argv ...string) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	res, err := d.runner.Run(ctx, argv)
	if err != nil {
		return res, fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	return res, nil
}

// must runs argv and returns its stdout, or an error (a *cmdError for a
// non-zero exit) that carries FreeBSD's message.
func (d *Driver) must(ctx context.Context, argv ...string) ([]byte, error) {
	res, err := d.run(ctx, argv...)
	if err != nil {
		return nil, err
	}
	if res.Code != 0 {
		return nil, &cmdError{argv: argv, code: res.Code, stderr: string(res.Stderr)}
	}
	return res.Stdout, nil
}

// tolerate runs a command whose failure with one of the messages in ok
// means that what it would do is already done (docs/freebsd-notes.md §11:
// errors are classified by these stderr substrings only). It reports
// whether it failed that way. Some commands print their reason on stdout
// (sbin/route/route.c newroute prints "route already in table" with
// printf), so both are searched.
func (d *Driver) tolerate(ctx context.Context, ok []string, argv ...string) (already bool, err error) {
	res, err := d.run(ctx, argv...)
	if err != nil {
		return false, err
	}
	if res.Code == 0 {
		return false, nil
	}
	e := &cmdError{argv: argv, code: res.Code, stderr: string(res.Stderr) + string(res.Stdout)}
	if e.has(ok...) {
		return true, nil
	}
	return false, e
}

// The messages by which FreeBSD says "already done" (docs/freebsd-notes.md
// §11, with the section that verified each).
var (
	// jail -r of a missing jail: `jail: "<name>" not found` (§1.7).
	msgJailNotFound = []string{"not found"}
	// zfs of a missing dataset: "cannot open '<ds>': dataset does not
	// exist" (§2.4).
	msgNoDataset = []string{"dataset does not exist"}
	// zfs destroy of a dataset in use: "pool or dataset is busy"; the
	// zombie case shows "Device busy" (§2.4).
	msgBusy = []string{"dataset is busy", "Device busy"}
	// zfs create/snapshot/clone of an existing name: "cannot create
	// snapshot '<ds>@<snap>': dataset already exists" (§2.2, the snapshot
	// race; sys/contrib/openzfs/lib/libzfs/libzfs_dataset.c EZFS_EXISTS).
	msgDatasetExists = []string{"dataset already exists"}
	// umount of a path that is not mounted: "not a file system root
	// directory" on 15.1 (§3.2).
	msgNotMounted = []string{"not a file system root directory", "not currently mounted"}
	// ifconfig alias/addm/create and route add of what exists: "File
	// exists", "already exists" (§4.2, §10.13): sbin/ifconfig/ifconfig.c
	// Perror "ioctl (SIOCAIFADDR): File exists", ifbridge.c "BRDGADD %s"
	// with EEXIST, ioctl_ifcreate "interface %s already exists" for an
	// epair unit in use; route(8) prints "route already in table" for
	// EEXIST (sbin/route/route.c newroute).
	msgExists = []string{"File exists", "already exists", "already in table"}
	// ifconfig of a missing interface: "interface <if> does not exist"
	// (§4.5).
	msgNoInterface = []string{"does not exist"}
	// ifconfig -alias of an absent address (§4.6).
	msgNoAddress = []string{"Can't assign requested address"}
	// route delete of a missing route: "not in table" before 15, "route has
	// not been found" on 15.0 and 15.1 (§4.7).
	msgNoRoute = []string{"not in table", "has not been found"}
	// rctl -r with no rules: "No such process" (§5); with RACCT off there
	// are no rules either (usr.bin/rctl/rctl.c enosys).
	msgNoRules = []string{"No such process", "RACCT/RCTL present, but disabled", "RACCT/RCTL support not present"}
	// kill of a pid that is gone: "kill: <pid>: No such process"
	// (bin/kill/kill.c warn).
	msgNoProcess = []string{"No such process"}
)
