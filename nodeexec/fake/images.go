package fake

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/oci"
)

var _ nodeexec.ImageStore = (*Driver)(nil)

// HasImage implements nodeexec.ImageStore.
func (d *Driver) HasImage(_ context.Context, digest string) (bool, error) {
	if _, err := oci.CheckDigest(digest); err != nil {
		return false, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.images[digest]
	return ok, nil
}

// AddImage implements nodeexec.ImageStore: the image is recorded, not
// unpacked (its layers are in the puller's cache, checked there). Its
// digest's instances can start from then on.
func (d *Driver) AddImage(_ context.Context, img *oci.Image, _ int64) error {
	if _, err := oci.CheckDigest(img.Digest); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.images[img.Digest] = nodeexec.ImageInfo{Digest: img.Digest, Manifest: img.Manifest, Size: img.Size, Added: d.now(), Layers: img.LayerDigests()}
	d.imageAdds++
	return nil
}

// Images implements nodeexec.ImageStore.
func (d *Driver) Images(context.Context) ([]nodeexec.ImageInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []nodeexec.ImageInfo
	for _, k := range slices.Sorted(maps.Keys(d.images)) {
		out = append(out, d.images[k])
	}
	return out, nil
}

// RemoveImage implements nodeexec.ImageStore. An image SetImageBusy
// marked is refused with ErrBusy, as the freebsd driver refuses one whose
// snapshot has clones.
func (d *Driver) RemoveImage(_ context.Context, digest string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.busyImages[digest] {
		return fmt.Errorf("image %s: %w", digest, nodeexec.ErrBusy)
	}
	delete(d.images, digest)
	return nil
}

// SetImageBusy makes RemoveImage of the image refuse (busy) or not.
func (d *Driver) SetImageBusy(digest string, busy bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.busyImages == nil {
		d.busyImages = map[string]bool{}
	}
	d.busyImages[digest] = busy
}

// ImageAdds is how many times AddImage added an image.
func (d *Driver) ImageAdds() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.imageAdds
}
