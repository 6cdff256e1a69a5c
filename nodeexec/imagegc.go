package nodeexec

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/keel-dev/keel/nodeexec/oci"
)

// Image garbage collection: the OCI images (and their cached layers)
// that no instance of the node uses or waits for go, once unused for a
// grace period, and only when asked: by keel image prune, or when the
// images take more than ImageGC.MaxSize or the state directory's file
// system has less than ImageGC.MinFree of its space free.

// DefaultImageGrace is how long an unpacked image is kept after it was
// added before the automatic collection may remove it, when
// ImageGC.Grace is zero.
const DefaultImageGrace = time.Hour

// DefaultImageMinFree is the share of the state directory's file system
// below which free space starts a collection, when ImageGC.MinFree is 0.
const DefaultImageMinFree = 0.10

// ImageGC configures the automatic collection of unused images.
type ImageGC struct {
	// Grace: an image added less than this long ago is kept
	// (DefaultImageGrace when zero).
	Grace time.Duration
	// MaxSize: collect when the images unpacked and the cached layers
	// take more bytes than this; 0 for no limit.
	MaxSize int64
	// MinFree: collect when less than this share of the state
	// directory's file system is free (DefaultImageMinFree when zero;
	// negative for never).
	MinFree float64
}

// PruneResult is what a collection removed.
type PruneResult struct {
	// Removed are the images removed, Kept those in use or in their grace
	// period.
	Removed, Kept []ImageInfo
	// Layers is how many cached layers were removed; Freed the bytes
	// freed, unpacked images and layers together.
	Layers int
	Freed  int64
	// Reason says why an automatic collection ran ("" for one asked).
	Reason string
}

// ErrPruning is returned while a collection is under way.
var ErrPruning = errors.New("a collection of images is under way")

// imageGC is the collection the Reconciler runs, on a goroutine it owns.
type imageGC struct {
	running bool
	// inUse are the digests the node's instances used or waited for when
	// the collection began: no pull starts and no start from another
	// image is decided while it runs (imageReady).
	inUse map[string]bool
	// Written by the collection's goroutine under Reconciler.mu.
	ended  bool
	result PruneResult
	err    error
	reply  func(PruneResult, error)
}

// PruneImages removes, on a goroutine the Reconciler owns, the images no
// instance of the node uses or waits for that were added more than grace
// ago (any age with grace 0), and the cached layers no image left uses;
// reply is called with what it did, from that goroutine. Only the owner
// calls it.
func (r *Reconciler) PruneImages(grace time.Duration, reply func(PruneResult, error)) error {
	return r.startGC(func(ctx context.Context, store ImageStore, inUse map[string]bool) (PruneResult, error) {
		return r.prune(ctx, store, inUse, grace, 0)
	}, reply)
}

// CollectImages starts the automatic collection when none runs: it
// measures what the images take and the file system's free space, and
// when either is past its bound removes unused images past their grace,
// oldest first, until it is not; reply, when not nil, is called with
// what it did, from its goroutine. Only the owner calls it.
func (r *Reconciler) CollectImages(reply func(PruneResult, error)) {
	gc := r.cfg.ImageGC
	if gc.Grace <= 0 {
		gc.Grace = DefaultImageGrace
	}
	if gc.MinFree == 0 {
		gc.MinFree = DefaultImageMinFree
	}
	_ = r.startGC(func(ctx context.Context, store ImageStore, inUse map[string]bool) (PruneResult, error) {
		used, err := r.imageUsage(ctx, store)
		if err != nil {
			return PruneResult{}, err
		}
		var want int64 // bytes to free
		reason := ""
		if gc.MaxSize > 0 && used > gc.MaxSize {
			want, reason = used-gc.MaxSize, fmt.Sprintf("images take %d bytes, more than the %d allowed", used, gc.MaxSize)
		}
		var st unix.Statfs_t
		if gc.MinFree > 0 && unix.Statfs(r.cfg.StateDir, &st) == nil && st.Blocks > 0 {
			total, free := int64(st.Blocks)*int64(st.Bsize), int64(st.Bavail)*int64(st.Bsize)
			if short := int64(gc.MinFree*float64(total)) - free; short > 0 && short > want {
				want, reason = short, fmt.Sprintf("%.1f%% of the file system is free, less than %.1f%%", 100*float64(free)/float64(total), 100*gc.MinFree)
			}
		}
		if want <= 0 {
			return PruneResult{}, nil
		}
		res, err := r.prune(ctx, store, inUse, gc.Grace, want)
		res.Reason = reason
		return res, err
	}, reply)
}

func (r *Reconciler) startGC(run func(context.Context, ImageStore, map[string]bool) (PruneResult, error), reply func(PruneResult, error)) error {
	store, ok := r.cfg.Driver.(ImageStore)
	if !ok {
		return fmt.Errorf("the %s driver keeps no OCI images", r.cfg.Driver.Name())
	}
	if r.gc.running {
		return ErrPruning
	}
	inUse := r.inUse()
	r.gc = imageGC{running: true, inUse: inUse, reply: reply}
	r.wg.Go(func() {
		ctx, cancel := context.WithTimeout(r.ctx, pullTimeout)
		defer cancel()
		res, err := run(ctx, store, inUse)
		r.mu.Lock()
		r.gc.ended, r.gc.result, r.gc.err = true, res, err
		r.mu.Unlock()
		if reply != nil {
			reply(res, err)
		}
		select {
		case r.wake <- struct{}{}:
		default:
		}
	})
	return nil
}

// imageUsage is the bytes the unpacked images and the cached layers take.
func (r *Reconciler) imageUsage(ctx context.Context, store ImageStore) (int64, error) {
	images, err := store.Images(ctx)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, img := range images {
		n += img.Unpacked
	}
	if r.cfg.Puller != nil {
		blobs, err := r.cfg.Puller.Blobs()
		if err != nil {
			return 0, err
		}
		for _, b := range blobs {
			n += b.Size
		}
	}
	return n, nil
}

// prune removes the unused images added before grace ago, oldest first,
// until want bytes are freed (all of them when want is 0), then the
// cached blobs downloaded before grace ago that neither an image left
// nor an artifact in use needs. It runs on the collection's goroutine.
func (r *Reconciler) prune(ctx context.Context, store ImageStore, inUse map[string]bool, grace time.Duration, want int64) (PruneResult, error) {
	var res PruneResult
	images, err := store.Images(ctx)
	if err != nil {
		return res, err
	}
	slices.SortFunc(images, func(a, b ImageInfo) int { return a.Added.Compare(b.Added) })
	now := r.cfg.Now()
	keep := map[string]bool{} // layers of the images kept, artifacts in use
	for k := range inUse {
		if d, ok := strings.CutPrefix(k, artifactKeyPrefix); ok {
			keep[d] = true
		}
	}
	for _, img := range images {
		if inUse[img.Digest] || now.Sub(img.Added) < grace || (want > 0 && res.Freed >= want) {
			res.Kept = append(res.Kept, img)
			for _, l := range img.Layers {
				keep[l] = true
			}
			continue
		}
		if err := store.RemoveImage(ctx, img.Digest); errors.Is(err, ErrBusy) {
			// Something the node's instances do not account for still
			// depends on it (on FreeBSD a clone of its snapshot): it is
			// kept, with its layers, and the others still go.
			r.log.Warn("image kept: still in use", "digest", img.Digest, "err", err)
			res.Kept = append(res.Kept, img)
			for _, l := range img.Layers {
				keep[l] = true
			}
			continue
		} else if err != nil {
			return res, fmt.Errorf("remove image %s: %w", img.Digest, err)
		}
		r.log.Info("image removed", "digest", img.Digest, "bytes", img.Unpacked, "added", img.Added)
		res.Removed = append(res.Removed, img)
		res.Freed += img.Unpacked
	}
	if r.cfg.Puller == nil {
		return res, nil
	}
	blobs, err := r.cfg.Puller.Blobs()
	if err != nil {
		return res, err
	}
	for _, d := range slices.Sorted(maps.Keys(blobs)) {
		if keep[d] || (grace > 0 && now.Sub(blobs[d].Added) < grace) {
			continue
		}
		if err := r.cfg.Puller.RemoveBlob(d); errors.Is(err, oci.ErrLayerInUse) {
			continue // a pull under way needs it
		} else if err != nil {
			return res, err
		}
		res.Layers++
		res.Freed += blobs[d].Size
	}
	return res, nil
}

// collectGC folds an ended collection: the images it removed are no
// longer taken as there. Only the owner calls it, under r.mu.
func (r *Reconciler) collectGC() {
	if !r.gc.running || !r.gc.ended {
		return
	}
	for _, img := range r.gc.result.Removed {
		delete(r.images, img.Digest)
	}
	// An artifact not in use may have been removed: the next start that
	// needs it looks in the cache again.
	maps.DeleteFunc(r.images, func(k string, _ bool) bool {
		return strings.HasPrefix(k, artifactKeyPrefix) && !r.gc.inUse[k]
	})
	switch res, err := r.gc.result, r.gc.err; {
	case err != nil:
		r.log.Warn("image collection failed", "err", err)
	case len(res.Removed) > 0 || res.Layers > 0:
		r.log.Info("images collected", "removed", len(res.Removed), "layers", res.Layers, "freed", res.Freed, "reason", res.Reason)
	}
	r.gc = imageGC{}
}
