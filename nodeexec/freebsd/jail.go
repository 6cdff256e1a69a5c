package freebsd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

// jid returns the JID of an instance's jail: `jls -j <name> jid`. Any
// non-zero exit means there is no such jail: jls exits 1 for a missing jail
// and for a usage error alike, and the driver's arguments are fixed
// (docs/freebsd-notes.md §1.2).
func (d *Driver) jid(ctx context.Context, instance string) (int, bool, error) {
	res, err := d.run(ctx, "jls", "-j", jailName(instance), "jid")
	if err != nil {
		return 0, false, err
	}
	if res.Code != 0 {
		return 0, false, nil
	}
	jid, ok := parseJID(res.Stdout)
	return jid, ok, nil
}

// jails lists the jails that are Keel's, by instance: `jls jid name`, the
// names keel-<instance> with a valid instance name. Plain jls shows no
// names (docs/freebsd-notes.md §1.4); other jails are never looked at.
func (d *Driver) jails(ctx context.Context) (map[string]int, error) {
	out, err := d.must(ctx, "jls", "jid", "name")
	if err != nil {
		return nil, err
	}
	jails := map[string]int{}
	for _, j := range parseJails(out) {
		inst, ok := strings.CutPrefix(j.Name, "keel-")
		if ok && checkName("instance", inst) == nil {
			jails[inst] = j.JID
		}
	}
	return jails, nil
}

// procs lists the processes in a jail: `ps -J <jid> -o pid= -o state= -o
// lstart=` (docs/freebsd-notes.md §1.5, with one -o per keyword: see
// parsePS). ps exits 1 when nothing matched (bin/ps/ps.c); any other
// failure is an error, never "no process": that would start a second
// copy.
func (d *Driver) procs(ctx context.Context, jid int) ([]psEntry, error) {
	argv := []string{"ps", "-J", strconv.Itoa(jid), "-o", "pid=", "-o", "state=", "-o", "lstart="}
	res, err := d.run(ctx, argv...)
	if err != nil {
		return nil, err
	}
	if res.Code != 0 {
		if res.Code == 1 && len(strings.TrimSpace(string(res.Stderr))) == 0 && len(strings.TrimSpace(string(res.Stdout))) == 0 {
			return nil, nil
		}
		return nil, &cmdError{argv: argv, code: res.Code, stderr: string(res.Stderr)}
	}
	return parsePS(res.Stdout, d.loc)
}

// live keeps the processes that are not zombies.
func live(procs []psEntry) []psEntry {
	return slices.DeleteFunc(slices.Clone(procs), psEntry.zombie)
}

// createJail creates the instance's persistent, empty jail on its root,
// exactly as docs/freebsd-notes.md §1.1 says (usr.sbin/jail/jail.8:
// name=, path=, the vnet boolean, mount.devfs with devfs_ruleset=4, the
// standard devfsrules_jail, and persist). The root's /dev must exist for
// mount.devfs.
func (d *Driver) createJail(ctx context.Context, instance string, vnet bool) error {
	root := d.rootfs(instance)
	// A root that ran a jail before (a host rebooted) is the jail's: its
	// /dev may be a link out of it, which mkdir must not follow (jail(8)
	// itself refuses a devfs mount point outside the jail: command.c
	// check_path).
	dev := d.hostPath(path.Join(root, "dev"))
	if fi, err := os.Lstat(dev); errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(dev, 0o755); err != nil {
			return err
		}
	} else if err != nil {
		return err
	} else if !fi.IsDir() {
		return fmt.Errorf("%s/dev in the jail's root is not a directory", root)
	}
	argv := []string{"jail", "-c", "name=" + jailName(instance), "path=" + root}
	if vnet {
		argv = append(argv, "vnet")
	}
	argv = append(argv, "mount.devfs", "devfs_ruleset=4", "persist")
	_, err := d.must(ctx, argv...)
	return err
}

// removeJail removes the instance's jail, killing whatever runs in it:
// `jail -r`, a jail that is not there being already removed
// (docs/freebsd-notes.md §1.7).
func (d *Driver) removeJail(ctx context.Context, instance string) error {
	_, err := d.tolerate(ctx, msgJailNotFound, "jail", "-r", jailName(instance))
	return err
}
