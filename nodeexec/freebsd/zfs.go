package freebsd

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/render"
)

// datasetExists runs `zfs list -H -o name <ds>`: exit 0 means it exists, 1
// that it does not, anything else is an error (docs/freebsd-notes.md §2.1;
// sys/contrib/openzfs/cmd/zfs/zfs_main.c zfs_do_list). It works for
// snapshots too.
func (d *Driver) datasetExists(ctx context.Context, ds string) (bool, error) {
	res, err := d.run(ctx, "zfs", "list", "-H", "-o", "name", ds)
	if err != nil {
		return false, err
	}
	switch res.Code {
	case 0:
		return true, nil
	case 1:
		return false, nil
	}
	return false, &cmdError{argv: []string{"zfs", "list", "-H", "-o", "name", ds}, code: res.Code, stderr: string(res.Stderr)}
}

// SnapshotName is the snapshot the driver takes of a base that has none.
const SnapshotName = "keel"

// keelSnapshot is what a snapshot of a base must be called for jails to be
// cloned from it: @keel, or @keel-<anything> for a refresh.
var keelSnapshot = regexp.MustCompile(`^keel(-[A-Za-z0-9._:-]+)?$`)

// baseSnapshot returns the snapshot of image that a new jail is cloned
// from: the newest (by creation transaction group) of the base's snapshots
// named keel or keel-<suffix>. When there is none it takes <base>@keel,
// tolerating another provision taking it at the same moment
// (docs/freebsd-notes.md §2.2, §10.4). An operator refreshes a base by
// changing it and taking a new snapshot, e.g. @keel-2026-05-01: new jails
// use it, existing clones keep theirs (a snapshot with clones cannot be
// destroyed, §2.2), and the old snapshot may be destroyed once its clones
// are gone.
func (d *Driver) baseSnapshot(ctx context.Context, image string) (string, error) {
	base := d.imageDataset(image)
	ok, err := d.datasetExists(ctx, base)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("image %s: the dataset %s does not exist (create the base image on this node first)", image, base)
	}
	// -d 1 lists the base's own snapshots, and zfs list orders the
	// snapshots of one dataset by creation transaction group, oldest first
	// (sys/contrib/openzfs/cmd/zfs/zfs_iter.c zfs_compare: "we want to sort
	// them according to creation time ... CREATETXG").
	out, err := d.must(ctx, "zfs", "list", "-H", "-o", "name", "-t", "snapshot", "-d", "1", base)
	if err != nil {
		return "", err
	}
	newest := ""
	for _, name := range parseZFSNames(out) {
		ds, snap, ok := strings.Cut(name, "@")
		if ok && ds == base && keelSnapshot.MatchString(snap) {
			newest = name
		}
	}
	if newest != "" {
		return newest, nil
	}
	snap := base + "@" + SnapshotName
	res, err := d.run(ctx, "zfs", "snapshot", snap)
	if err != nil {
		return "", err
	}
	if res.Code != 0 {
		// Another provision may have taken it since the listing.
		if ok, err := d.datasetExists(ctx, snap); err != nil || !ok {
			return "", &cmdError{argv: []string{"zfs", "snapshot", snap}, code: res.Code, stderr: string(res.Stderr)}
		}
	}
	return snap, nil
}

// cloneRoot makes the instance's root a clone of its image, unless the
// dataset exists already (a jail stopped, or the host rebooted): then it
// is kept as it is. The image is a base's newest keel snapshot
// (baseSnapshot) or an OCI image's <pool>/keel/images/<hex>@keel, which
// AddImage made. created reports whether this call made it.
func (d *Driver) cloneRoot(ctx context.Context, instance, image string) (created bool, err error) {
	ds := d.jailDataset(instance)
	ok, err := d.datasetExists(ctx, ds)
	if err != nil || ok {
		return false, err
	}
	var snap string
	if strings.HasPrefix(image, render.OCIPrefix) {
		var unlock func()
		if snap, unlock, err = d.imageSnapshot(ctx, image); err != nil {
			return false, err
		}
		defer unlock()
	} else if snap, err = d.baseSnapshot(ctx, image); err != nil {
		return false, err
	}
	// No -p: the parent <pool>/keel/jails is the operator's (§2.2).
	if _, err := d.must(ctx, "zfs", "clone", snap, ds); err != nil {
		return false, err
	}
	return true, nil
}

// Busy retries of zfs destroy (docs/freebsd-notes.md §2.4, §10.2): a short
// window after jail -r in which the kernel still holds the mount.
const (
	destroyAttempts = 10
	destroyPause    = 100 * time.Millisecond
)

// destroyDataset destroys ds (recursive destroys its snapshots too),
// tolerating one that does not exist, and retrying while it is busy. It
// returns an error wrapping nodeexec.ErrBusy when it stays busy.
func (d *Driver) destroyDataset(ctx context.Context, ds string, recursive bool) error {
	argv := []string{"zfs", "destroy", ds}
	if recursive {
		argv = []string{"zfs", "destroy", "-r", ds}
	}
	for attempt := 1; ; attempt++ {
		_, err := d.tolerate(ctx, msgNoDataset, argv...)
		var ce *cmdError
		if err == nil || !errors.As(err, &ce) || !ce.has(msgBusy...) {
			return err
		}
		if attempt == destroyAttempts {
			return fmt.Errorf("%w: %w", err, nodeexec.ErrBusy)
		}
		t := time.NewTimer(destroyPause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}
