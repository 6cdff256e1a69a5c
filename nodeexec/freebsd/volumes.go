package freebsd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/render"
)

// EnsureVolume implements nodeexec.Volumes: the dataset
// <pool>/keel/volumes/<name>, created with `zfs create -o quota=<size>`
// when missing (no quota for size 0), and its path on the host. An
// existing volume is returned as it is: its quota is not changed
// (docs/freebsd-notes.md §2.3).
func (d *Driver) EnsureVolume(ctx context.Context, name string, size render.Bytes) (string, error) {
	if err := checkName("volume", name); err != nil {
		return "", err
	}
	if size < 0 {
		return "", fmt.Errorf("volume %s: negative size", name)
	}
	ds := d.volumeDataset(name)
	ok, err := d.datasetExists(ctx, ds)
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", name, err)
	}
	if !ok {
		argv := []string{"zfs", "create"}
		if size > 0 {
			argv = append(argv, "-o", "quota="+size.String())
		}
		// Another EnsureVolume of the same name may have won.
		if _, err := d.tolerate(ctx, msgDatasetExists, append(argv, ds)...); err != nil {
			return "", fmt.Errorf("volume %s: %w", name, err)
		}
	}
	return d.volumePath(name), nil
}

// Volumes implements nodeexec.Volumes: the children of
// <pool>/keel/volumes (`zfs list -H -o name -r`, keeping the immediate
// children: docs/freebsd-notes.md §2.7), sorted.
func (d *Driver) Volumes(ctx context.Context) ([]string, error) {
	parent := d.pool + "/keel/volumes"
	res, err := d.run(ctx, "zfs", "list", "-H", "-o", "name", "-r", parent)
	if err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	if res.Code == 1 {
		return nil, nil // no parent, no volumes
	}
	if res.Code != 0 {
		return nil, fmt.Errorf("volumes: %w", &cmdError{argv: []string{"zfs", "list", "-H", "-o", "name", "-r", parent}, code: res.Code, stderr: string(res.Stderr)})
	}
	var names []string
	for _, ds := range parseZFSNames(res.Stdout) {
		if n, ok := strings.CutPrefix(ds, parent+"/"); ok && checkName("volume", n) == nil {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names, nil
}

// DeleteVolume implements nodeexec.Volumes: `zfs destroy -r` of the
// volume and its snapshots. It returns an error wrapping
// nodeexec.ErrNotFound when there is no such volume, and one wrapping
// nodeexec.ErrBusy, "still mounted by <instance>", while a jail's root has
// it mounted (a stopped jail keeps its mounts until it is destroyed).
func (d *Driver) DeleteVolume(ctx context.Context, name string) error {
	if err := checkName("volume", name); err != nil {
		return err
	}
	unlock := d.names.Lock("volume/" + name)
	defer unlock()
	ds := d.volumeDataset(name)
	ok, err := d.datasetExists(ctx, ds)
	if err != nil {
		return fmt.Errorf("volume %s: %w", name, err)
	}
	if !ok {
		return fmt.Errorf("volume %s: %w", name, nodeexec.ErrNotFound)
	}
	mounts, err := d.mounts(ctx)
	if err != nil {
		return fmt.Errorf("volume %s: %w", name, err)
	}
	src := d.volumePath(name)
	for _, m := range mounts {
		if m.Device != src || m.FSType != "nullfs" {
			continue
		}
		user := m.Point
		if rest, ok := strings.CutPrefix(m.Point, "/"+d.pool+"/keel/jails/"); ok {
			user, _, _ = strings.Cut(rest, "/")
		}
		return fmt.Errorf("volume %s: still mounted by %s: %w", name, user, nodeexec.ErrBusy)
	}
	if err := d.destroyDataset(ctx, ds, true); err != nil {
		return fmt.Errorf("volume %s: %w", name, err)
	}
	return nil
}

// mounts lists the host's mounts: `mount -p` (docs/freebsd-notes.md §3.3).
func (d *Driver) mounts(ctx context.Context) ([]mountEntry, error) {
	out, err := d.must(ctx, "mount", "-p")
	if err != nil {
		return nil, err
	}
	return parseMounts(out), nil
}

// unmount unmounts a path, one that is not mounted being done already
// (docs/freebsd-notes.md §3.2).
func (d *Driver) unmount(ctx context.Context, p string) error {
	_, err := d.tolerate(ctx, msgNotMounted, "umount", p)
	return err
}

// mountVolumes nullfs-mounts each of the instance's volumes at its mount
// path inside the jail's root, unless mount -p shows it there already:
// mount(8) would stack a second mount (docs/freebsd-notes.md §3.1, §10.34).
func (d *Driver) mountVolumes(ctx context.Context, spec nodeexec.InstanceSpec) error {
	if len(spec.Spec.Volumes) == 0 {
		return nil
	}
	mounts, err := d.mounts(ctx)
	if err != nil {
		return err
	}
	root := d.rootfs(spec.Name)
	for _, v := range spec.Spec.Volumes {
		src := d.volumePath(v.Name)
		if ok, err := d.datasetExists(ctx, d.volumeDataset(v.Name)); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("volume %s does not exist (EnsureVolume it first)", v.Name)
		}
		target, err := d.mountTarget(root, v.MountPath)
		if err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		i := slices.IndexFunc(mounts, func(m mountEntry) bool { return m.Point == target })
		if i >= 0 {
			if m := mounts[i]; m.Device == src && m.FSType == "nullfs" {
				continue
			}
			return fmt.Errorf("volume %s: %s is already a mount point of %s", v.Name, target, mounts[i].Device)
		}
		if _, err := d.must(ctx, "mount", "-t", "nullfs", src, target); err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
	}
	return nil
}

// cleanMountPath is a mount path as the jail sees it, cleaned.
func cleanMountPath(p string) string { return path.Clean("/" + p) }

// maxSymlinks bounds the symbolic links followed in one mount path, as
// the kernel's MAXSYMLINKS.
const maxSymlinks = 32

// mountTarget returns the FreeBSD path at which to mount mountPath inside
// the jail root rootfs, creating the directories it lacks. Symbolic links
// on the way are followed as the jail would follow them: an absolute link
// starts again at rootfs, and ".." never climbs above it. The jail's own
// processes (root inside it) may have made any of these components a link
// to the host's /etc: without this, mkdir and mount(8), which run on the
// host, would follow it out of the jail.
func (d *Driver) mountTarget(rootfs, mountPath string) (string, error) {
	parts := strings.Split(mountPath, "/")
	cur := "" // relative to rootfs, cleaned, every component a directory
	links := 0
	for len(parts) > 0 {
		p := parts[0]
		parts = parts[1:]
		switch p {
		case "", ".":
			continue
		case "..":
			cur = strings.TrimPrefix(path.Dir("/"+cur), "/")
			continue
		}
		next := path.Join(cur, p)
		host := d.hostPath(path.Join(rootfs, next))
		fi, err := os.Lstat(host)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(host, 0o755); err != nil {
				return "", err
			}
			cur = next
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink != 0:
			if links++; links > maxSymlinks {
				return "", fmt.Errorf("%s: too many levels of symbolic links", mountPath)
			}
			target, err := os.Readlink(host)
			if err != nil {
				return "", err
			}
			if path.IsAbs(target) {
				cur = ""
			}
			parts = append(strings.Split(target, "/"), parts...)
		case fi.IsDir():
			cur = next
		default:
			return "", fmt.Errorf("%s: %s is not a directory", mountPath, "/"+next)
		}
	}
	if cur == "" {
		return "", fmt.Errorf("%s: resolves to the jail's root", mountPath)
	}
	target := path.Join(rootfs, cur)
	if strings.IndexFunc(target, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 {
		return "", fmt.Errorf("%s: resolves to %q, which mount -p cannot show", mountPath, target)
	}
	return target, nil
}
