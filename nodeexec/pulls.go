package nodeexec

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/keel-dev/keel/nodeexec/oci"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
)

// DefaultMaxPulls is how many images a node pulls at once when
// Config.MaxPulls is zero.
const DefaultMaxPulls = 2

// pullTimeout bounds one pull, download and unpacking together.
const pullTimeout = 30 * time.Minute

// pull is an OCI image or an artifact a pass wants on the node: an
// instance placed here is to start from it (or will, once the rollout
// releases it). One of the Reconciler's goroutines fetches it
// (Config.Puller) and, for an image, adds it to the driver (ImageStore),
// never the owner's: until it is there, the instance's start waits, and
// the instance it replaces keeps running.
type pull struct {
	ref render.ImageRef  // an image's
	art *render.Artifact // or, when not nil, an artifact's
	// urls are the URLs the pass's instances name the artifact's file
	// by (one, but for instances that disagree).
	urls []string

	// Written by the pull's goroutine under Reconciler.mu.
	ended bool
	err   error

	// cancel ends the pull when no pass wants it any more.
	cancel context.CancelFunc

	// The owner's.
	running  bool
	failures int
	retryAt  time.Time
	lastErr  error
	wanted   bool // by the current pass
}

// Pulls are keyed by what they fetch: an image by its digest, an
// artifact by artifactKey.
const artifactKeyPrefix = "artifact:"

// artifactKey is the key of the pull of the artifact of sha256 hex h.
func artifactKey(h string) string { return artifactKeyPrefix + "sha256:" + h }

// what names the pull's object in logs and reports: the image, or the
// artifact's digest and path (its URL, which may carry a pre-signed
// query, goes to errors without it).
func (p *pull) what() string {
	if p.art != nil {
		return "artifact sha256:" + p.art.SHA256 + " " + p.art.Path
	}
	return p.ref.Name()
}

// ociImage returns the OCI image an instance's spec names, ok false for
// a node-local base.
func ociImage(spec render.JailSpec) (render.ImageRef, bool) {
	ref, err := render.ParseImage(spec.Image)
	return ref, err == nil && ref.IsOCI()
}

// sourcesReady reports whether what the instance starts from is there:
// its image (always, for a node-local base; for an OCI image once a pull
// has found or added it) and its artifacts (once in the cache).
// Otherwise it asks for the pulls.
func (r *Reconciler) sourcesReady(spec render.JailSpec, now time.Time) bool {
	ready := true
	if ref, ok := ociImage(spec); ok {
		ready = r.sourceReady(ref.Digest, func() *pull { return &pull{ref: ref} }, now)
	}
	for i := range spec.Artifacts {
		a := &spec.Artifacts[i]
		if !r.sourceReady(artifactKey(a.SHA256), func() *pull { return &pull{art: a} }, now) {
			ready = false
		}
	}
	return ready
}

// waitsFor is the key of the pull the instance's start waits for that
// the report shows: the first that failed, else the first; "" when none.
func (r *Reconciler) waitsFor(spec render.JailSpec) string {
	var keys []string
	if ref, ok := ociImage(spec); ok && !r.images[ref.Digest] {
		keys = append(keys, ref.Digest)
	}
	for _, a := range spec.Artifacts {
		if k := artifactKey(a.SHA256); !r.images[k] {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		if p := r.pulls[k]; p != nil && p.lastErr != nil {
			return k
		}
	}
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

// keepPulls marks the pulls of an instance the pass leaves alone (busy
// with an operation, or held) as still wanted: a download under way is
// not thrown away for a moment's restart.
func (r *Reconciler) keepPulls(spec render.JailSpec) {
	keep := func(k string) {
		if p := r.pulls[k]; p != nil {
			r.wanted[k], p.wanted = true, true
		}
	}
	if ref, ok := ociImage(spec); ok {
		keep(ref.Digest)
	}
	for _, a := range spec.Artifacts {
		keep(artifactKey(a.SHA256))
	}
}

func (r *Reconciler) sourceReady(key string, mk func() *pull, now time.Time) bool {
	r.wanted[key] = true
	if r.gc.running && !r.gc.inUse[key] {
		return false // it may be being removed: wait for the collection
	}
	if r.images[key] {
		return true
	}
	r.wantPull(key, mk, now)
	return false
}

// wantPull starts the pull of key, unless it runs, waits for its retry,
// or every pull slot is taken (a later pass starts it).
func (r *Reconciler) wantPull(key string, mk func() *pull, now time.Time) {
	p := r.pulls[key]
	if p == nil {
		p = mk()
		r.pulls[key] = p
	} else if !p.running && !p.wanted {
		// What the newest specs say (the first instance of the pass that
		// wants it): an artifact's file moved to another URL, its
		// checksum, the key, the same, is tried there at once.
		fresh := mk()
		if fresh.art != nil && p.art != nil && fresh.art.URL != p.art.URL && !slices.Contains(p.urls, fresh.art.URL) {
			p.retryAt = time.Time{}
		}
		p.ref, p.art = fresh.ref, fresh.art
		p.urls = nil
	}
	if !p.running && p.art != nil {
		if u := mk().art.URL; !slices.Contains(p.urls, u) {
			p.urls = append(p.urls, u)
		}
	}
	p.wanted = true
	if p.running || now.Before(p.retryAt) {
		return
	}
	// A slot bounds downloads; an artifact already in the cache only
	// needs its check (a restarted agent finds its instances' files
	// there, and their restarts do not wait behind other downloads).
	cached := p.art != nil && r.cfg.Puller != nil && r.cfg.Puller.HasArtifact(*p.art)
	if !cached && r.pullsRunning() >= r.cfg.MaxPulls {
		return
	}
	p.running = true
	r.mu.Lock()
	p.ended, p.err = false, nil
	r.mu.Unlock()
	r.log.Info("pulling", "what", p.what(), "attempt", p.failures+1)
	ctx, cancel := context.WithCancel(r.ctx)
	p.cancel = cancel
	r.wg.Go(func() {
		defer cancel()
		err := r.runPull(ctx, p)
		r.mu.Lock()
		p.ended, p.err = true, err
		r.mu.Unlock()
		select {
		case r.wake <- struct{}{}:
		default:
		}
	})
}

func (r *Reconciler) pullsRunning() int {
	n := 0
	for _, p := range r.pulls {
		if p.running {
			n++
		}
	}
	return n
}

// runPull fetches the image's layers and adds it to the driver, when the
// driver does not hold it already, or fetches the artifact into the
// cache. It runs on a goroutine of its own.
func (r *Reconciler) runPull(ctx context.Context, p *pull) error {
	if p.art != nil {
		if r.cfg.Puller == nil {
			return errors.New("this node fetches no artifacts (no cache configured)")
		}
		ctx, cancel := context.WithTimeout(ctx, pullTimeout)
		defer cancel()
		start := time.Now()
		a := *p.art
		if len(p.urls) > 0 {
			// Instances naming this file by different URLs: each attempt
			// tries the next.
			a.URL = p.urls[p.failures%len(p.urls)]
		}
		blob, err := r.cfg.Puller.FetchArtifact(ctx, a, func(pr oci.Progress) {
			r.log.Info("fetching artifact", "what", p.what(), "bytes", pr.Done, "of", pr.Total)
		})
		if err != nil {
			return err
		}
		// Checked now, while the instance it replaces still runs: its
		// checksum (a cache changed by hand is fetched again at the next
		// attempt) and, for an archive, its format and every entry.
		if err := oci.CheckArtifact(ctx, oci.CachedArtifact{Artifact: a, Blob: blob}, r.cfg.Puller.MaxUnpacked); err != nil {
			if errors.Is(err, oci.ErrArtifactCache) {
				_ = r.cfg.Puller.RemoveBlob("sha256:" + a.SHA256)
			}
			return err
		}
		r.log.Info("artifact ready", "what", p.what(), "took", time.Since(start).Round(time.Millisecond))
		return nil
	}
	store, ok := r.cfg.Driver.(ImageStore)
	if !ok {
		return fmt.Errorf("the %s driver cannot run OCI images", r.cfg.Driver.Name())
	}
	ctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	opCtx, opCancel := r.op(ctx)
	has, err := store.HasImage(opCtx, p.ref.Digest)
	opCancel()
	if err != nil {
		return err
	}
	if has {
		return nil
	}
	if r.cfg.Puller == nil {
		return errors.New("this node pulls no OCI images (no image cache configured)")
	}
	start := time.Now()
	img, err := r.cfg.Puller.Fetch(ctx, p.ref, func(pr oci.Progress) {
		r.log.Info("pulling image", "image", p.ref.Name(), "bytes", pr.Done, "of", pr.Total)
	})
	if err != nil {
		return err
	}
	defer r.cfg.Puller.Unpin(img)
	fetched := time.Since(start)
	if err := store.AddImage(ctx, img, r.cfg.Puller.MaxUnpacked); err != nil {
		return fmt.Errorf("unpacking %s: %w", p.ref.Name(), err)
	}
	r.log.Info("image pulled", "image", p.ref.Name(), "layers", len(img.Layers), "bytes", img.Size,
		"fetch", fetched.Round(time.Millisecond), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// collectPulls folds the pulls that ended: an image added is ready; a
// failure is retried after a backoff that doubles (1 s up to 5 min).
// Pulls that no pass wants any more are forgotten. Only the owner calls
// it.
func (r *Reconciler) collectPulls(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.collectGC()
	for digest, p := range r.pulls {
		if !p.running || !p.ended {
			continue
		}
		p.running = false
		if p.err == nil {
			r.images[digest] = true
			delete(r.pulls, digest)
			continue
		}
		p.failures++
		p.lastErr = p.err
		delay := minBackoff << min(p.failures-1, 9)
		p.retryAt = now.Add(min(delay, maxBackoff))
		r.log.Warn("pull failed", "what", p.what(), "err", p.err, "failures", p.failures, "retryIn", min(delay, maxBackoff))
	}
}

// prunePulls forgets, after a pass, the pulls it did not want that do
// not run, and clears the marks for the next pass.
func (r *Reconciler) prunePulls() {
	maps.DeleteFunc(r.pulls, func(_ string, p *pull) bool { return !p.wanted && !p.running })
	for _, p := range r.pulls {
		if !p.wanted && p.running {
			// No instance wants it any more (a new commit): its slot
			// goes to the pulls that are wanted.
			p.cancel()
		}
		p.wanted = false
	}
}

// pullWait is since when an instance waits for its image at a spec.
type pullWait struct {
	hash  string
	since time.Time
}

// notePulling records, after a pass, since when each instance whose
// start waits for its image has waited at its spec; the others are
// forgotten.
func (r *Reconciler) notePulling(now time.Time) {
	for name, o := range r.pulling {
		if w, ok := r.pullWaits[name]; !ok || w.hash != o.spec.SpecHash {
			r.pullWaits[name] = pullWait{hash: o.spec.SpecHash, since: now}
		}
	}
	maps.DeleteFunc(r.pullWaits, func(name string, _ pullWait) bool { return r.pulling[name] == nil })
}

// pullStatus is what a report says of an instance's image pull (its
// progress goes to the log only: a report changes when a pull starts,
// fails or ends, not with each layer).
func (r *Reconciler) pullStatus(name, key string) *report.Pull {
	p := r.pulls[key]
	if p == nil {
		return nil
	}
	w := r.pullWaits[name]
	what := p.what()
	if len(what) > report.MaxPullImage {
		what = strings.ToValidUTF8(what[:report.MaxPullImage-3], "") + "..."
	}
	out := &report.Pull{Image: what, Failures: p.failures, SpecHash: w.hash, Since: w.since.UTC().Truncate(time.Millisecond)}
	if p.lastErr != nil {
		out.Error = p.lastErr.Error()
		if len(out.Error) > report.MaxProblemText {
			out.Error = strings.ToValidUTF8(out.Error[:report.MaxProblemText-3], "") + "..."
		}
	}
	return out
}

// ForgetImage drops an image from what the reconciler takes as unpacked
// (it was removed from the driver): the next start from it pulls again.
// Only the owner calls it.
func (r *Reconciler) ForgetImage(digest string) { delete(r.images, digest) }

// ImagesInUse are the OCI images (digests) that the instances this node
// holds were made from, or that the instances placed here need (pulled,
// being pulled or to be pulled): never to be removed. Only the owner
// calls it.
func (r *Reconciler) ImagesInUse() []string {
	var out []string
	for k := range r.inUse() {
		if !strings.HasPrefix(k, artifactKeyPrefix) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// inUse are the images and artifacts (pull keys) that the instances this
// node holds were made with, or that the instances placed here need.
func (r *Reconciler) inUse() map[string]bool {
	in := map[string]bool{}
	add := func(spec render.JailSpec) {
		if ref, ok := ociImage(spec); ok {
			in[ref.Digest] = true
		}
		for _, a := range spec.Artifacts {
			in[artifactKey(a.SHA256)] = true
		}
	}
	for _, st := range r.state.Instances {
		add(st.Spec)
	}
	for _, o := range r.ops {
		add(o.spec.Spec)
	}
	for k := range r.pulls {
		in[k] = true
	}
	for k := range r.wanted {
		in[k] = true
	}
	return in
}

// maxUnpacked bounds what an artifact's archive extracts to.
func (r *Reconciler) maxUnpacked() int64 {
	if r.cfg.Puller == nil {
		return 0
	}
	return r.cfg.Puller.MaxUnpacked
}

// cachedArtifacts are spec's artifacts with their files in the cache, for
// the driver to place.
func (r *Reconciler) cachedArtifacts(spec render.JailSpec) []oci.CachedArtifact {
	if len(spec.Artifacts) == 0 || r.cfg.Puller == nil {
		return nil
	}
	out := make([]oci.CachedArtifact, 0, len(spec.Artifacts))
	for _, a := range spec.Artifacts {
		// render checked the sha256; were it wrong, the empty path fails
		// the driver's placing rather than the artifact being left out.
		blob, _ := r.cfg.Puller.ArtifactPath(a.SHA256)
		out = append(out, oci.CachedArtifact{Artifact: a, Blob: blob})
	}
	return out
}
