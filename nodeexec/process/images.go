package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/oci"
)

// OCI images live in <state>/images/oci/<hex>: root/, the unpacked file
// system, and image.json (nodeexec.ImageInfo), written last: a directory
// without it is an unpacking cut short, never used and removed on the
// next AddImage of its digest. Instance roots are hard-linked copies of
// root/ (a file rewritten in place by an instance would change it for
// every instance of the image: the process driver isolates nothing).

const imageMeta = "image.json"

// maxImageMeta bounds image.json when it is read back.
const maxImageMeta = 64 << 10

func (d *Driver) ociDir() string { return filepath.Join(d.root, "images", "oci") }

// ociImageDir is the directory of an image, by its digest.
func (d *Driver) ociImageDir(digest string) (string, error) {
	hex, err := oci.CheckDigest(digest)
	if err != nil {
		return "", err
	}
	return filepath.Join(d.ociDir(), hex), nil
}

// HasImage implements nodeexec.ImageStore.
func (d *Driver) HasImage(_ context.Context, digest string) (bool, error) {
	dir, err := d.ociImageDir(digest)
	if err != nil {
		return false, err
	}
	_, err = readImageInfo(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// AddImage implements nodeexec.ImageStore: it unpacks into a temporary
// directory next to the image's and renames it into place once whole.
func (d *Driver) AddImage(ctx context.Context, img *oci.Image, maxUnpacked int64) error {
	dir, err := d.ociImageDir(img.Digest)
	if err != nil {
		return err
	}
	unlock := d.names.Lock("image/" + img.Digest)
	defer unlock()
	if _, err := readImageInfo(dir); err == nil {
		return nil
	}
	if err := removeTree(dir); err != nil { // cut short before
		return err
	}
	if err := os.MkdirAll(d.ociDir(), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(d.ociDir(), ".unpack-*")
	if err != nil {
		return err
	}
	defer func() {
		if err := removeTree(tmp); err != nil {
			d.log.Warn("could not remove an unpacking's temporary directory", "dir", tmp, "err", err)
		}
	}()
	root := filepath.Join(tmp, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return err
	}
	n, err := oci.Unpack(ctx, img, root, maxUnpacked)
	if err != nil {
		return err
	}
	info := nodeexec.ImageInfo{Digest: img.Digest, Manifest: img.Manifest, Size: img.Size, Unpacked: n, Added: d.now().UTC(), Layers: img.LayerDigests()}
	data, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	if err := nodeexec.WriteFileAtomic(filepath.Join(tmp, imageMeta), data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	d.log.Info("image unpacked", "digest", img.Digest, "bytes", n)
	return nil
}

// sweepImages removes what an unpacking or a removal cut short by a
// crash left: temporary directories, and images without their
// image.json. It runs when the driver is made, before any AddImage.
func (d *Driver) sweepImages() error {
	entries, err := os.ReadDir(d.ociDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		dir := filepath.Join(d.ociDir(), e.Name())
		if _, err := readImageInfo(dir); err == nil {
			continue
		}
		d.log.Info("removing an image unpacked or removed only in part", "dir", dir)
		if err := removeTree(dir); err != nil {
			return err
		}
	}
	return nil
}

// Images implements nodeexec.ImageStore.
func (d *Driver) Images(_ context.Context) ([]nodeexec.ImageInfo, error) {
	entries, err := os.ReadDir(d.ociDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []nodeexec.ImageInfo
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || !e.IsDir() {
			continue
		}
		info, err := readImageInfo(filepath.Join(d.ociDir(), e.Name()))
		if err != nil {
			continue // cut short
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b nodeexec.ImageInfo) int { return strings.Compare(a.Digest, b.Digest) })
	return out, nil
}

// RemoveImage implements nodeexec.ImageStore. The roots linked from it
// keep their files (hard links).
func (d *Driver) RemoveImage(_ context.Context, digest string) error {
	dir, err := d.ociImageDir(digest)
	if err != nil {
		return err
	}
	unlock := d.names.Lock("image/" + digest)
	defer unlock()
	// image.json first: a removal cut short is an unpacking cut short.
	if err := os.Remove(filepath.Join(dir, imageMeta)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return removeTree(dir)
}

// readImageInfo reads an image's image.json, which only a whole image has.
func readImageInfo(dir string) (nodeexec.ImageInfo, error) {
	var info nodeexec.ImageInfo
	f, err := os.Open(filepath.Join(dir, imageMeta))
	if err != nil {
		return info, err
	}
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		return info, err
	case !fi.Mode().IsRegular() || fi.Size() > maxImageMeta:
		return info, fmt.Errorf("%s: not an image's metadata", f.Name())
	}
	if err := json.NewDecoder(f).Decode(&info); err != nil {
		return info, fmt.Errorf("%s: %w", f.Name(), err)
	}
	return info, nil
}
