package fbsdsim

import (
	"fmt"
	"os"
	"strings"
)

// mountUsage is usage() in sbin/mount/mount.c.
const mountUsage = "usage: mount [-adflpruvw] [-F fstab] [-o options] [-t [no]type[,type ...]]\n" +
	"       mount [-dfpruvw] special | node\n" +
	"       mount [-dfpruvw] [-o options] [-t [no]type[,type ...]] special node\n"

// cmdMount is mount(8): `mount -p` (putfsent), plain `mount`, and
// `mount -t nullfs|devfs special node`. mount(8) execs mount_nullfs for
// nullfs and exits with its status (mount.c mountfs).
func cmdMount(c *call, args []string) int {
	r := getopt("mount", args, "adF:fLlno:prt:uvw")
	if r.bad != 0 {
		fmt.Fprint(c.errb, r.msg+mountUsage)
		return 1
	}
	fstype, list := "", false
	for _, o := range r.opts {
		switch o.c {
		case 'p':
			list = true
		case 't':
			fstype = o.arg
		case 'o', 'v', 'w':
		default:
			fmt.Fprintf(c.errb, "fbsdsim: mount -%c is not modelled\n", o.c)
			return 1
		}
	}
	if len(r.rest) == 0 {
		for _, m := range c.st.Mounts {
			// mount.c main: checkvfsname filters the listing by -t.
			if fstype != "" && m.FSType != fstype {
				continue
			}
			if list {
				c.outf("%s", putfsent(m))
			} else {
				c.outf("%s on %s (%s, local)\n", m.From, m.On, m.FSType)
			}
		}
		return 0
	}
	if len(r.rest) != 2 {
		fmt.Fprintf(c.errb, "fbsdsim: mount %s is not modelled\n", strings.Join(args, " "))
		return 1
	}
	src, dst := r.rest[0], r.rest[1]
	switch fstype {
	case "nullfs":
		// sbin/mount/mount.c mountfs: mount(8) resolves the mount point
		// itself (checkpath_allow_file, a directory or a regular file)
		// and fails with xo_warn("%s", mntpath), exit 1, before it runs
		// mount_nullfs.
		if fi, err := os.Stat(c.path(dst)); err != nil {
			fmt.Fprintf(c.errb, "mount: %s: No such file or directory\n", dst)
			return 1
		} else if !fi.IsDir() && !fi.Mode().IsRegular() {
			fmt.Fprintf(c.errb, "mount: %s: Not a directory\n", dst)
			return 1
		}
		// sbin/mount_nullfs/mount_nullfs.c main: checkpath of the
		// target (the source directory), then of the mount point,
		// err(EX_USAGE, ...); mount(8) exits with its status. mount(8)
		// does not refuse a path already mounted: a second nullfs mount
		// stacks (docs/freebsd-notes.md §3.1, §10.34).
		for _, p := range []string{src, dst} {
			if fi, err := os.Stat(c.path(p)); err != nil {
				fmt.Fprintf(c.errb, "mount_nullfs: %s: No such file or directory\n", p)
				return 64
			} else if !fi.IsDir() {
				fmt.Fprintf(c.errb, "fbsdsim: a nullfs mount of or on a file (%s) is not modelled\n", p)
				return 1
			}
		}
		if under(src, dst) || under(dst, src) {
			fmt.Fprintf(c.errb, "mount_nullfs: %s (%s) and %s are not distinct paths\n", src, src, dst)
			return 64
		}
		c.st.Mounts = append(c.st.Mounts, Mount{From: src, On: dst, FSType: "nullfs", Opts: c.optsBelow(src)})
		return 0
	case "devfs":
		if _, err := os.Stat(c.path(dst)); err != nil {
			fmt.Fprintf(c.errb, "mount: %s: No such file or directory\n", dst)
			return 1
		}
		c.st.Mounts = append(c.st.Mounts, Mount{From: "devfs", On: dst, FSType: "devfs", Opts: "rw,multilabel"})
		return 0
	}
	fmt.Fprintf(c.errb, "fbsdsim: mount -t %q is not modelled\n", fstype)
	return 1
}

// putfsent is sbin/mount/mount.c putfsent: fields padded with tabs by
// length (< 8, < 16, < 24), so the padding varies
// (docs/freebsd-notes.md §3.3), then "\t0 0" for a file system not in
// fstab.
func putfsent(m Mount) string {
	pad := func(s string) string {
		l := len(s)
		p := s
		if l < 8 {
			p += "\t"
		}
		if l < 16 {
			p += "\t"
		}
		if l < 24 {
			p += "\t"
		} else {
			p += " "
		}
		return p
	}
	opts := m.Opts
	if len(opts) < 8 {
		opts += "\t"
	} else {
		opts += " "
	}
	return pad(m.From) + pad(m.On) + m.FSType + "\t" + opts + "\t0 0\n"
}

// umountUsage is usage() in sbin/umount/umount.c.
const umountUsage = "usage: umount [-fNnv] special ... | node ... | fsid ...\n" +
	"       umount -a | -A [-F fstab] [-fnv] [-h host] [-t type]\n"

// cmdUmount is umount(8) (sbin/umount/umount.c checkname/umountfs). A
// directory that is no mount point is "not a file system root directory"
// (also for one already unmounted, docs/freebsd-notes.md §3.2); a
// missing path fails statfs; a mount with another mounted below it is
// busy.
func cmdUmount(c *call, args []string) int {
	r := getopt("umount", args, "AaF:fh:Nnt:v")
	if r.bad != 0 {
		fmt.Fprint(c.errb, r.msg+umountUsage)
		return 1
	}
	for _, o := range r.opts {
		if o.c == 'a' || o.c == 'A' || o.c == 'h' || o.c == 'F' || o.c == 't' {
			fmt.Fprintf(c.errb, "fbsdsim: umount -%c is not modelled\n", o.c)
			return 1
		}
	}
	if len(r.rest) == 0 {
		fmt.Fprint(c.errb, umountUsage)
		return 1
	}
	status := 0
	for _, p := range r.rest {
		name := strings.TrimSuffix(p, "/")
		if name == "" {
			name = "/"
		}
		idx := -1
		for i, m := range c.st.Mounts {
			if m.On == name || m.From == name && m.FSType == "zfs" {
				idx = i
			}
		}
		if idx < 0 {
			// checkname: statfs fails for a missing path; a directory
			// on the same device as its parent is no root; anything
			// else (a file) is no known mount either.
			if fi, err := os.Stat(c.path(name)); err != nil {
				fmt.Fprintf(c.errb, "umount: %s: statfs: No such file or directory\numount: %s: unknown file system\n", name, name)
			} else if fi.IsDir() {
				fmt.Fprintf(c.errb, "umount: %s: not a file system root directory\n", name)
			} else {
				fmt.Fprintf(c.errb, "umount: %s: unknown file system\n", name)
			}
			status = 1
			continue
		}
		m := c.st.Mounts[idx]
		busy := false
		for i, o := range c.st.Mounts {
			if i > idx && o.On != m.On && under(o.On, m.On) || o.FSType == "nullfs" && i != idx && under(o.From, m.On) {
				busy = true
			}
		}
		if m.FSType == "zfs" {
			for _, j := range c.st.Jails {
				if under(j.Path, m.On) {
					busy = true
				}
			}
		}
		if busy {
			fmt.Fprintf(c.errb, "umount: unmount of %s failed: Device busy\n", m.On)
			status = 1
			continue
		}
		c.st.Mounts = append(c.st.Mounts[:idx], c.st.Mounts[idx+1:]...)
	}
	return status
}

// optsBelow returns the options mount -p shows for a nullfs mount of
// dir: those of the file system holding dir, whose flags nullfs_statfs
// reports (sys/fs/nullfs/null_vfsops.c: "sbp->f_flags = mstat.f_flags"),
// so a nullfs of a ZFS dataset shows rw,nfsv4acls.
func (c *call) optsBelow(dir string) string {
	opts, best := "rw", -1
	for _, m := range c.st.Mounts {
		if under(dir, m.On) && len(m.On) > best {
			opts, best = m.Opts, len(m.On)
		}
	}
	return opts
}
