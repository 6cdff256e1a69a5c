package agent

import (
	"context"
	"log/slog"
	"slices"
	gosync "sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/keel-dev/keel/providers/forge"
)

// recordingForge keeps what it was given, like a forge, and answers
// each post of a commit with the next of its errors for that commit (nil
// when none is left); while gate is set, a post waits for it.
type recordingForge struct {
	mu    gosync.Mutex
	posts []forge.Status
	calls map[string]int // by commit
	errs  map[string][]error
	gate  chan struct{}
}

func (f *recordingForge) Post(ctx context.Context, st forge.Status) error {
	f.mu.Lock()
	gate := f.gate
	f.calls[st.Commit]++
	var err error
	if errs := f.errs[st.Commit]; len(errs) > 0 {
		err, f.errs[st.Commit] = errs[0], errs[1:]
	}
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.posts = append(f.posts, st)
	f.mu.Unlock()
	return nil
}

func (f *recordingForge) descriptions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, p := range f.posts {
		out = append(out, p.Description)
	}
	return out
}

func (f *recordingForge) callsFor(commit string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[commit]
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const (
	commitA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	commitB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func status(commit string, state forge.State, desc string) []forge.Status {
	return []forge.Status{{Commit: commit, State: state, Context: "keel/n1", Description: desc}}
}

func newTestForgeWorker(t *testing.T, f *recordingForge, progress time.Duration) (*forgeWorker, *prometheus.Registry) {
	t.Helper()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	reg := prometheus.NewRegistry()
	w := newForgeWorker(ForgeOptions{Poster: f, RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond, Progress: progress},
		slog.New(slog.DiscardHandler), newForgeMetrics(reg))
	t.Cleanup(w.close)
	return w, reg
}

// Progress of a converging node (pending to pending, the description
// alone changing) is posted at most every Progress, the newest; a change
// of state is posted at once.
func TestForgeWorkerThrottlesProgress(t *testing.T) {
	f := &recordingForge{}
	w, _ := newTestForgeWorker(t, f, 2*time.Second)
	w.set(status(commitA, forge.Pending, "0 of 3 running"))
	eventually(t, "the first pending", func() bool { return len(f.descriptions()) == 1 })
	w.set(status(commitA, forge.Pending, "1 of 3 running"))
	w.set(status(commitA, forge.Pending, "2 of 3 running"))
	eventually(t, "the held progress", func() bool { return len(f.descriptions()) == 2 })
	w.set(status(commitA, forge.Success, "3 instances run at this commit"))
	eventually(t, "success", func() bool { return len(f.descriptions()) == 3 })
	want := []string{"0 of 3 running", "2 of 3 running", "3 instances run at this commit"}
	if got := f.descriptions(); !slices.Equal(got, want) {
		t.Errorf("posted %q, want %q", got, want)
	}
}

// While a post is under way, newer sets replace one another: only the
// last is posted after it.
func TestForgeWorkerLatestWins(t *testing.T) {
	gate := make(chan struct{})
	f := &recordingForge{gate: gate}
	w, _ := newTestForgeWorker(t, f, time.Millisecond)
	w.set(status(commitA, forge.Pending, "first"))
	eventually(t, "a post under way", func() bool { return f.callsFor(commitA) == 1 })
	w.set(status(commitA, forge.Success, "second"))
	w.set(status(commitB, forge.Failure, "third"))
	w.set(status(commitB, forge.Failure, "fourth"))
	f.mu.Lock()
	f.gate = nil
	f.mu.Unlock()
	close(gate)
	eventually(t, "the newest set posted", func() bool { return len(f.descriptions()) == 2 })
	if got := f.descriptions(); !slices.Equal(got, []string{"first", "fourth"}) {
		t.Errorf("posted %q", got)
	}
}

// A temporary error is tried again until the forge takes the status; a
// permanent one is not, until the status changes; each counts.
func TestForgeWorkerRetries(t *testing.T) {
	f := &recordingForge{errs: map[string][]error{
		commitA: {&forge.HTTPError{Code: 503}, &forge.NetError{}},
		commitB: {&forge.HTTPError{Code: 401}},
	}}
	w, reg := newTestForgeWorker(t, f, time.Millisecond)
	w.set(status(commitA, forge.Success, "ok"))
	eventually(t, "posted after two temporary errors", func() bool { return len(f.descriptions()) == 1 })
	if n := f.callsFor(commitA); n != 3 {
		t.Errorf("%d calls, want 3", n)
	}
	w.set(append(status(commitA, forge.Success, "ok"), status(commitB, forge.Failure, "refused")...))
	eventually(t, "the refusal tried", func() bool { return f.callsFor(commitB) == 1 })
	// The next status of B goes to the forge; the refused one was not
	// retried meanwhile.
	w.set(append(status(commitA, forge.Success, "ok"), status(commitB, forge.Failure, "refused again")...))
	eventually(t, "the next status of B", func() bool { return len(f.descriptions()) == 2 })
	if n := f.callsFor(commitB); n != 2 {
		t.Errorf("%d calls for B, want 2 (no retry of a permanent error)", n)
	}
	if n := f.callsFor(commitA); n != 3 {
		t.Errorf("%d calls for A: an unchanged status was posted again", n)
	}
	if ok, errs := testutil.ToFloat64(w.metrics.posts.WithLabelValues("ok")), testutil.ToFloat64(w.metrics.posts.WithLabelValues("error")); ok != 2 || errs != 3 {
		t.Errorf("posts ok %v error %v, want 2 and 3", ok, errs)
	}
	if n, err := testutil.GatherAndCount(reg, "keel_forge_status_posts_total"); err != nil || n != 2 {
		t.Errorf("%d series (%v), want ok and error only", n, err)
	}
}

// close cancels a post under way and waits for the worker.
func TestForgeWorkerCloseCancelsAHangingPost(t *testing.T) {
	f := &recordingForge{gate: make(chan struct{}), calls: map[string]int{}}
	reg := prometheus.NewRegistry()
	w := newForgeWorker(ForgeOptions{Poster: f}, slog.New(slog.DiscardHandler), newForgeMetrics(reg))
	w.set(status(commitA, forge.Pending, "x"))
	eventually(t, "a post under way", func() bool { return f.callsFor(commitA) == 1 })
	w.close() // returns: the test would time out otherwise
}
