package freebsd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/render"
)

// OCI images (docs/images.md, "Where images live"). The image of digest
// sha256:<hex> is the dataset <pool>/keel/images/<hex>: its layers are
// unpacked into its mountpoint, it is set readonly=on, and its snapshot
// @keel is taken last, with the image's metadata as user properties of
// the snapshot (zfs snapshot -o, so that the snapshot and its metadata
// appear in one transaction: sys/contrib/openzfs/lib/libzfs/
// libzfs_dataset.c zfs_snapshot_nvl hands both to lzc_snapshot). The
// snapshot is the mark of a whole image: a dataset without it is an
// unpacking cut short (a crash, a full disk), never used, destroyed and
// redone by the next AddImage of its digest. Instance roots are clones of
// the snapshot (cloneRoot); while one exists, ZFS refuses to destroy the
// image (zfs destroy -r without -R: cmd/zfs/zfs_main.c
// destroy_check_dependent), and RemoveImage says so with ErrBusy.

var _ nodeexec.ImageStore = (*Driver)(nil)

// The user properties of an image's @keel snapshot. A user property's
// name holds lowercase letters, digits and "-_.:" with a colon
// (module/zcommon/zfs_prop.c zfs_prop_user).
const (
	propManifest = "keel:manifest" // the manifest's digest
	propSize     = "keel:size"     // the layers' compressed bytes
	propUnpacked = "keel:unpacked" // the bytes of the image's files
	propAdded    = "keel:added"    // RFC 3339, UTC
	propLayers   = "keel:layers"   // how many layers
	// propLayerList is the prefix of keel:layers.0, keel:layers.1, ...:
	// the layers' digests, layersPerProp a property, comma-separated.
	propLayerList = "keel:layers."
)

// layersPerProp keeps a property's value under the 1024 bytes older
// libzfs allowed a user property (ZFS_MAXPROPLEN; the kernel's bound,
// ZAP_MAXVALUELEN, is 8192): 14 digests of 71 characters and 13 commas
// are 1007. An image has at most 256 layers (package oci), so at most 19
// such properties.
const layersPerProp = 14

// msgDependentClones is zfs destroy's refusal to destroy a dataset whose
// snapshot has clones outside it: "cannot destroy '<ds>': filesystem has
// dependent clones" then "use '-R' to destroy the following datasets:" and
// one clone a line (cmd/zfs/zfs_main.c destroy_check_dependent, run before
// anything is destroyed).
var msgDependentClones = []string{"has dependent clones"}

// imagesParent is the parent of the image datasets. The driver creates it
// when missing (its only parent it creates: it holds nothing but what the
// driver puts there), without -p, so that a mistyped pool fails loudly.
func (d *Driver) imagesParent() string { return d.pool + "/keel/images" }

// ociDataset is the dataset of an image, by its digest: the digest is
// checked before it becomes a dataset name.
func (d *Driver) ociDataset(digest string) (string, error) {
	hex, err := oci.CheckDigest(digest)
	if err != nil {
		return "", err
	}
	return d.imagesParent() + "/" + hex, nil
}

// imageInfo reads the metadata of an image from its @keel snapshot:
// `zfs get -H -s local -o name,property,value all <ds>@keel`, the
// snapshot's own properties (zfs_main.c get_callback; -s local leaves out
// what it inherits). whole is false when the snapshot does not exist, or
// lacks its metadata (then it was not made by AddImage and is not used).
func (d *Driver) imageInfo(ctx context.Context, digest, snap string) (info nodeexec.ImageInfo, whole bool, err error) {
	argv := []string{"zfs", "get", "-H", "-s", "local", "-o", "name,property,value", "all", snap}
	res, err := d.run(ctx, argv...)
	if err != nil {
		return info, false, err
	}
	if res.Code != 0 {
		e := &cmdError{argv: argv, code: res.Code, stderr: string(res.Stderr)}
		if e.has(msgNoDataset...) {
			return info, false, nil
		}
		return info, false, e
	}
	info, err = imageFromProps(digest, parseZFSGet(res.Stdout)[snap])
	if err != nil {
		d.log.Warn("an image's snapshot without its metadata is not used", "digest", digest, "snapshot", snap, "err", err)
		return info, false, nil
	}
	return info, true, nil
}

// HasImage implements nodeexec.ImageStore: the image's @keel snapshot
// exists with its metadata.
func (d *Driver) HasImage(ctx context.Context, digest string) (bool, error) {
	ds, err := d.ociDataset(digest)
	if err != nil {
		return false, err
	}
	_, whole, err := d.imageInfo(ctx, digest, ds+"@"+SnapshotName)
	return whole, err
}

// AddImage implements nodeexec.ImageStore: it creates the image's dataset
// (after destroying one an unpacking cut short left), unpacks img into its
// mountpoint, sets it readonly and takes @keel with the metadata. A
// failure destroys the dataset again; a crash leaves it without its
// snapshot, which no one uses and the next AddImage replaces.
func (d *Driver) AddImage(ctx context.Context, img *oci.Image, maxUnpacked int64) error {
	ds, err := d.ociDataset(img.Digest)
	if err != nil {
		return err
	}
	// What becomes a property value is checked too: digests only.
	if _, err := oci.CheckDigest(img.Manifest); err != nil {
		return fmt.Errorf("image %s: manifest: %w", img.Digest, err)
	}
	for _, l := range img.Layers {
		if _, err := oci.CheckDigest(l.Digest); err != nil {
			return fmt.Errorf("image %s: layer: %w", img.Digest, err)
		}
	}
	unlock := d.names.Lock("image/" + img.Digest)
	defer unlock()
	snap := ds + "@" + SnapshotName
	if _, whole, err := d.imageInfo(ctx, img.Digest, snap); err != nil || whole {
		return err
	}
	if err := d.ensureImagesParent(ctx); err != nil {
		return fmt.Errorf("image %s: %w", img.Digest, err)
	}
	if ok, err := d.datasetExists(ctx, ds); err != nil {
		return err
	} else if ok {
		// Cut short before (its snapshot, the last step, is missing).
		if err := d.destroyDataset(ctx, ds, true); err != nil {
			return fmt.Errorf("image %s: removing an unpacking cut short: %w", img.Digest, err)
		}
	}
	if _, err := d.must(ctx, "zfs", "create", ds); err != nil {
		return fmt.Errorf("image %s: %w", img.Digest, err)
	}
	n, err := d.fillImage(ctx, img, ds, maxUnpacked)
	if err != nil {
		// Even when ctx ended: a canceled pull leaves nothing behind.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmdTimeout)
		defer cancel()
		if derr := d.destroyDataset(cctx, ds, true); derr != nil {
			d.log.Warn("removing an image cut short (the next pull of it will)", "digest", img.Digest, "err", derr)
		}
		return fmt.Errorf("image %s: %w", img.Digest, err)
	}
	d.log.Info("image unpacked", "digest", img.Digest, "dataset", ds, "bytes", n)
	return nil
}

// ensureImagesParent creates <pool>/keel/images when it is missing,
// tolerating another AddImage creating it at the same moment.
func (d *Driver) ensureImagesParent(ctx context.Context) error {
	parent := d.imagesParent()
	ok, err := d.datasetExists(ctx, parent)
	if err != nil || ok {
		return err
	}
	_, err = d.tolerate(ctx, msgDatasetExists, "zfs", "create", parent)
	return err
}

// fillImage unpacks img into the new dataset ds, then sets it readonly and
// takes its @keel snapshot with the metadata. It returns the bytes
// unpacked.
func (d *Driver) fillImage(ctx context.Context, img *oci.Image, ds string, maxUnpacked int64) (int64, error) {
	// Where the files go is where ZFS mounted the dataset: a dataset
	// that is not mounted (mountpoint=none or legacy inherited, canmount)
	// would let them land in the file system below, and the snapshot
	// would be empty (zfs_main.c get_callback prints the values in the
	// order asked).
	out, err := d.must(ctx, "zfs", "get", "-H", "-o", "value", "mounted,mountpoint", ds)
	if err != nil {
		return 0, err
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != 2 || lines[0] != "yes" || !path.IsAbs(lines[1]) || path.Clean(lines[1]) != lines[1] {
		return 0, fmt.Errorf("the dataset %s is not mounted where its files can be written (zfs get mounted,mountpoint: %q)", ds, out)
	}
	dir := d.hostPath(lines[1])
	// A new file system's root is empty; anything else is not ours to
	// write into.
	if ents, err := os.ReadDir(dir); err != nil {
		return 0, err
	} else if len(ents) > 0 {
		return 0, fmt.Errorf("the mountpoint %s of the new dataset %s is not empty", lines[1], ds)
	}
	n, err := oci.Unpack(ctx, img, dir, maxUnpacked)
	if err != nil {
		return 0, err
	}
	if _, err := d.must(ctx, "zfs", "set", "readonly=on", ds); err != nil {
		return 0, err
	}
	info := nodeexec.ImageInfo{Digest: img.Digest, Manifest: img.Manifest, Size: img.Size, Unpacked: n,
		Added: d.now().UTC(), Layers: img.LayerDigests()}
	argv := []string{"zfs", "snapshot"}
	for _, kv := range imageProps(info) {
		argv = append(argv, "-o", kv)
	}
	if _, err := d.must(ctx, append(argv, ds+"@"+SnapshotName)...); err != nil {
		return 0, err
	}
	return n, nil
}

// Images implements nodeexec.ImageStore: the whole images, by digest,
// from one `zfs get -H -r -t snapshot -s local -o name,property,value all
// <pool>/keel/images` (the snapshots below it and their own properties).
func (d *Driver) Images(ctx context.Context) ([]nodeexec.ImageInfo, error) {
	parent := d.imagesParent()
	argv := []string{"zfs", "get", "-H", "-r", "-t", "snapshot", "-s", "local", "-o", "name,property,value", "all", parent}
	res, err := d.run(ctx, argv...)
	if err != nil {
		return nil, err
	}
	if res.Code != 0 {
		e := &cmdError{argv: argv, code: res.Code, stderr: string(res.Stderr)}
		if e.has(msgNoDataset...) {
			return nil, nil // no image was ever added
		}
		return nil, e
	}
	var out []nodeexec.ImageInfo
	for name, props := range parseZFSGet(res.Stdout) {
		hex, ok := strings.CutPrefix(name, parent+"/")
		if !ok {
			continue
		}
		hex, ok = strings.CutSuffix(hex, "@"+SnapshotName)
		if !ok {
			continue // another snapshot, not Keel's
		}
		digest := "sha256:" + hex
		if _, err := oci.CheckDigest(digest); err != nil {
			continue // not an image Keel added
		}
		info, err := imageFromProps(digest, props)
		if err != nil {
			d.log.Warn("an image's snapshot without its metadata is not used", "snapshot", name, "err", err)
			continue
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b nodeexec.ImageInfo) int { return strings.Compare(a.Digest, b.Digest) })
	return out, nil
}

// RemoveImage implements nodeexec.ImageStore: `zfs destroy -r` of the
// image's dataset, which takes its snapshot along. While an instance's
// root is a clone of the snapshot, ZFS refuses (and destroys nothing): the
// error names the roots and wraps nodeexec.ErrBusy. -R, which would
// destroy the roots, is never used.
func (d *Driver) RemoveImage(ctx context.Context, digest string) error {
	ds, err := d.ociDataset(digest)
	if err != nil {
		return err
	}
	unlock := d.names.Lock("image/" + digest)
	defer unlock()
	err = d.destroyDataset(ctx, ds, true)
	var ce *cmdError
	if errors.As(err, &ce) && ce.has(msgDependentClones...) {
		var roots []string
		for _, c := range parseDependents(ce.stderr) {
			if inst, ok := strings.CutPrefix(c, d.pool+"/keel/jails/"); ok {
				c = "instance " + inst
			}
			roots = append(roots, c)
		}
		return fmt.Errorf("image %s is in use: the root of %s is a clone of %s@%s: %w",
			digest, strings.Join(roots, ", "), ds, SnapshotName, nodeexec.ErrBusy)
	}
	if err != nil {
		return fmt.Errorf("image %s: %w", digest, err)
	}
	return nil
}

// imageSnapshot returns the snapshot a root of an OCI image is cloned
// from, <pool>/keel/images/<hex>@keel, with the image's lock held (so that
// RemoveImage never runs between the check and the clone): the caller
// calls unlock once the clone is made.
func (d *Driver) imageSnapshot(ctx context.Context, image string) (snap string, unlock func(), err error) {
	ref, err := render.ParseImage(image)
	if err != nil {
		return "", nil, err
	}
	ds, err := d.ociDataset(ref.Digest)
	if err != nil {
		return "", nil, err
	}
	snap = ds + "@" + SnapshotName
	unlock = d.names.Lock("image/" + ref.Digest)
	ok, err := d.datasetExists(ctx, snap)
	if err == nil && !ok {
		err = fmt.Errorf("image %s is not pulled on this node (no snapshot %s)", image, snap)
	}
	if err != nil {
		unlock()
		return "", nil, err
	}
	return snap, unlock, nil
}

// imageProps are the user properties of an image's @keel snapshot, as
// property=value arguments of zfs snapshot -o, in a fixed order.
func imageProps(info nodeexec.ImageInfo) []string {
	out := []string{
		propManifest + "=" + info.Manifest,
		propSize + "=" + strconv.FormatInt(info.Size, 10),
		propUnpacked + "=" + strconv.FormatInt(info.Unpacked, 10),
		propAdded + "=" + info.Added.UTC().Format(time.RFC3339Nano),
		propLayers + "=" + strconv.Itoa(len(info.Layers)),
	}
	for i := 0; i*layersPerProp < len(info.Layers); i++ {
		chunk := info.Layers[i*layersPerProp : min((i+1)*layersPerProp, len(info.Layers))]
		out = append(out, propLayerList+strconv.Itoa(i)+"="+strings.Join(chunk, ","))
	}
	return out
}

// imageFromProps is the image of digest described by the user properties
// of its @keel snapshot, or an error saying what is missing or wrong: a
// snapshot without all of them was not taken by AddImage.
func imageFromProps(digest string, props map[string]string) (nodeexec.ImageInfo, error) {
	info := nodeexec.ImageInfo{Digest: digest, Manifest: props[propManifest]}
	if _, err := oci.CheckDigest(info.Manifest); err != nil {
		return info, fmt.Errorf("%s: %w", propManifest, err)
	}
	num := func(prop string) (int64, error) {
		n, err := strconv.ParseInt(props[prop], 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s is %q, not a count", prop, props[prop])
		}
		return n, nil
	}
	var err error
	if info.Size, err = num(propSize); err != nil {
		return info, err
	}
	if info.Unpacked, err = num(propUnpacked); err != nil {
		return info, err
	}
	if info.Added, err = time.Parse(time.RFC3339Nano, props[propAdded]); err != nil {
		return info, fmt.Errorf("%s: %w", propAdded, err)
	}
	info.Added = info.Added.UTC()
	n, err := num(propLayers)
	if err != nil {
		return info, err
	}
	for i := 0; int64(len(info.Layers)) < n; i++ {
		v, ok := props[propLayerList+strconv.Itoa(i)]
		if !ok || v == "" {
			return info, fmt.Errorf("%d layers, but no %s%d", n, propLayerList, i)
		}
		for _, l := range strings.Split(v, ",") {
			if _, err := oci.CheckDigest(l); err != nil {
				return info, fmt.Errorf("%s%d: %w", propLayerList, i, err)
			}
			info.Layers = append(info.Layers, l)
		}
	}
	if int64(len(info.Layers)) != n {
		return info, fmt.Errorf("%s is %d, but %d layers are listed", propLayers, n, len(info.Layers))
	}
	return info, nil
}
