package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/cgi"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// config is one run's settings.
type config struct {
	nodes    int
	mode     string // "poll" or "gossip"
	duration time.Duration
	warmup   time.Duration
	// interval is the poll and report interval of poll mode, and the
	// deadline of one fetch or publication in both modes.
	interval time.Duration
	// heartbeat and safetyPoll are gossip mode's sparse publication and
	// fetch.
	heartbeat, safetyPoll time.Duration
	// churn is the content changes per node per minute (gossip mode).
	churn float64
	// maxDelay bounds the simulated gossip delivery delay.
	maxDelay time.Duration
	// inflight bounds the git operations of all nodes at once.
	inflight int
	// server is "default" (git's defaults) or "anysha1"
	// (uploadpack.allowAnySHA1InWant true).
	server string
	dir    string
	// table, when set, is a markdown file the result row is appended to.
	table string
}

func defaultConfig() config {
	return config{nodes: 50, mode: "gossip", duration: 3 * time.Minute,
		interval: 10 * time.Second, heartbeat: 60 * time.Second, safetyPoll: 60 * time.Second,
		maxDelay: 500 * time.Millisecond, inflight: 8 * runtime.GOMAXPROCS(0), server: "default"}
}

func (c *config) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.nodes, "nodes", c.nodes, "simulated nodes")
	fs.StringVar(&c.mode, "mode", c.mode, "poll (every node fetches everything every interval and republishes every interval) or gossip (publish on change plus heartbeat, fetch what a notice names)")
	fs.DurationVar(&c.duration, "duration", c.duration, "whole run, warm-up included")
	fs.DurationVar(&c.warmup, "warmup", c.warmup, "start of the run left out of the steady-state figures (0: the start-up stagger plus one interval)")
	fs.DurationVar(&c.interval, "interval", c.interval, "poll and report interval (poll mode); deadline of a fetch or publication")
	fs.DurationVar(&c.heartbeat, "heartbeat", c.heartbeat, "gossip mode: republish the same content this often")
	fs.DurationVar(&c.safetyPoll, "safety-poll", c.safetyPoll, "gossip mode: fetch what changed this often without a notice")
	fs.Float64Var(&c.churn, "churn", c.churn, "gossip mode: content changes per node per minute (0: steady state)")
	fs.DurationVar(&c.maxDelay, "gossip-delay", c.maxDelay, "gossip mode: a notice reaches each peer after a random delay up to this")
	fs.IntVar(&c.inflight, "inflight", c.inflight, "git operations in flight at once, all nodes together")
	fs.StringVar(&c.server, "server", c.server, "default (git's defaults) or anysha1 (uploadpack.allowAnySHA1InWant)")
	fs.StringVar(&c.dir, "dir", "", "work directory (default: a temporary one, removed)")
	fs.StringVar(&c.table, "table", "", "append the result as a markdown table row to this file")
}

// stagger is the time over which the nodes start: the longest period of
// their loops (the interval in poll mode, the heartbeat and the safety
// poll in gossip mode), so that no period starts in step on every node.
func (c config) stagger() time.Duration {
	if c.mode == "poll" {
		return c.interval
	}
	return max(c.heartbeat, c.safetyPoll)
}

const prefix = render.DefaultReportRefPrefix

// stats collects the steady-state measurements.
type stats struct {
	mu                     gosync.Mutex
	steady                 bool
	fetchLat, publishLat   []time.Duration
	fetches, publishes     int
	failedFetch, failedPub int
	missed                 int
	firstErr               string
	// bytes served to fetches, and requests, counted by the server.
	fetchBytes, requests atomic.Int64
}

// op records an operation that took d once started, and whole from when
// the node wanted it (the wait for a slot under -inflight included): it
// missed its cycle when whole passed the deadline.
func (s *stats) op(kind string, d, whole time.Duration, err error, deadline time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.steady {
		return
	}
	switch kind {
	case "fetch":
		s.fetches++
		if err != nil {
			s.failedFetch++
		} else {
			s.fetchLat = append(s.fetchLat, d)
		}
	case "publish":
		s.publishes++
		if err != nil {
			s.failedPub++
		} else {
			s.publishLat = append(s.publishLat, d)
		}
	}
	if err != nil && s.firstErr == "" {
		s.firstErr = err.Error()
	}
	if err == nil && whole > deadline {
		s.missed++
	}
}

// countingWriter counts the bytes of a response.
type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w countingWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.n.Add(int64(n))
	return n, err
}

func (w countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// node is one simulated agent.
type node struct {
	name       string
	pub, fetch *sync.Mirror
	// version is the content version of the node's report.
	version int
	// heard is the newest content version of each peer the node heard
	// of by gossip; have what it fetched. Guarded by mu.
	mu          gosync.Mutex
	heard, have map[string]int
	wake        chan struct{}
}

type harness struct {
	cfg    config
	nodes  []*node
	byName map[string]*node
	st     *stats
	sem    chan struct{}
	timers gosync.WaitGroup
}

func run(ctx context.Context, cfg config, out io.Writer) (*stats, error) {
	if cfg.dir == "" {
		d, err := os.MkdirTemp("", "keel-scale-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		cfg.dir = d
	}
	st, err := runIn(ctx, cfg, out)
	if err != nil {
		// Said at once: removing the mirrors of a thousand nodes takes minutes.
		fmt.Fprintln(out, "scale: error:", err)
	}
	return st, err
}

func runIn(ctx context.Context, cfg config, out io.Writer) (*stats, error) {
	if cfg.mode != "poll" && cfg.mode != "gossip" {
		return nil, fmt.Errorf("mode %q: want poll or gossip", cfg.mode)
	}
	if cfg.warmup == 0 {
		cfg.warmup = cfg.stagger() + cfg.interval
	}
	if cfg.warmup >= cfg.duration {
		return nil, errors.New("the warm-up must be shorter than the run")
	}
	dir := cfg.dir
	bare, err := makeServerRepo(ctx, dir, cfg.server)
	if err != nil {
		return nil, err
	}
	execPath, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		return nil, fmt.Errorf("git --exec-path: %w", err)
	}
	h := &harness{cfg: cfg, st: &stats{}, sem: make(chan struct{}, cfg.inflight), byName: map[string]*node{}}
	backend := &cgi.Handler{Path: filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend"), Stderr: io.Discard,
		Env: []string{"GIT_PROJECT_ROOT=" + filepath.Dir(bare), "GIT_HTTP_EXPORT_ALL=1", "REMOTE_USER=keel",
			"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1"}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.st.requests.Add(1)
		if strings.Contains(r.URL.Path, "upload-pack") || r.URL.Query().Get("service") == "git-upload-pack" {
			w = countingWriter{w, &h.st.fetchBytes}
		}
		backend.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	defer func() {
		// Shutdown, unlike Close, waits for the requests in flight: a
		// git-http-backend still writing objects into the repository when
		// the run returns races its caller's removal of the directory.
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	}()
	url := "http://" + ln.Addr().String() + "/" + filepath.Base(bare)

	for i := range cfg.nodes {
		n := &node{name: fmt.Sprintf("node%04d", i), heard: map[string]int{}, have: map[string]int{}, wake: make(chan struct{}, 1)}
		if n.pub, err = sync.OpenMirror(ctx, filepath.Join(dir, "nodes", n.name, "publisher"), sync.Remote{URL: url}, prefix); err != nil {
			return nil, err
		}
		h.nodes = append(h.nodes, n)
		h.byName[n.name] = n
	}
	if err := h.seed(ctx, dir, url); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "scale: %d nodes, mode %s, server %s, %s (warm-up %s), %d git operations in flight at most, GOMAXPROCS %d\n",
		cfg.nodes, cfg.mode, cfg.server, cfg.duration, cfg.warmup, cfg.inflight, runtime.GOMAXPROCS(0))

	runCtx, cancel := context.WithTimeout(ctx, cfg.duration)
	defer cancel()
	var wg gosync.WaitGroup
	start := time.Now()
	for _, n := range h.nodes {
		offset := time.Duration(rand.Int64N(int64(cfg.stagger())))
		wg.Go(func() { h.runNode(runCtx, n, offset) })
	}
	// Warm-up, then the steady state.
	var before, after sample
	select {
	case <-time.After(cfg.warmup):
	case <-runCtx.Done():
	}
	before, err = takeSample(bare, false)
	if err != nil {
		return nil, err
	}
	h.st.mu.Lock()
	h.st.steady = true
	h.st.mu.Unlock()
	h.st.fetchBytes.Store(0)
	h.st.requests.Store(0)
	<-runCtx.Done()
	h.st.mu.Lock()
	h.st.steady = false
	h.st.mu.Unlock()
	after, err = takeSample(bare, true)
	if err != nil {
		return nil, err
	}
	steady := time.Since(start) - cfg.warmup
	wg.Wait()
	h.timers.Wait()
	return h.st, h.print(out, before, after, steady)
}

// seed starts the cluster as one that has been running: every node has
// published its first report, and every node's mirror holds every report
// (a copy of one mirror that fetched them all), as a long-running agent's
// does. A thousand first clones at once would measure the first start of
// a whole cluster, not its steady state.
func (h *harness) seed(ctx context.Context, dir, url string) error {
	var wg gosync.WaitGroup
	errs := make(chan error, len(h.nodes))
	for _, n := range h.nodes {
		wg.Go(func() {
			// Not measured, and a thousand at once: each gets seedTimeout,
			// not the three intervals of a measured operation.
			if err := h.doWithin(ctx, "publish", max(seedTimeout, 3*h.cfg.interval), func(ctx context.Context) error {
				_, err := n.pub.Publish(ctx, n.name, makeReport(n.name, 0, time.Now()), time.Now())
				return err
			}); err != nil {
				errs <- fmt.Errorf("seed %s: %w", n.name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	seedDir := filepath.Join(dir, "seed")
	remote := sync.Remote{URL: url, Branch: "main"}
	m, err := sync.OpenMirror(ctx, seedDir, remote, prefix)
	if err != nil {
		return err
	}
	if _, err := m.Fetch(ctx); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	for _, n := range h.nodes {
		repo := filepath.Join(dir, "nodes", n.name, "repo")
		if out, err := exec.CommandContext(ctx, "cp", "-a", seedDir, repo).CombinedOutput(); err != nil {
			return fmt.Errorf("seed %s: %w: %s", n.name, err, out)
		}
		if n.fetch, err = sync.OpenMirror(ctx, repo, remote, prefix); err != nil {
			return err
		}
		for _, p := range h.nodes {
			n.heard[p.name], n.have[p.name] = 0, 0
		}
	}
	return nil
}

// makeServerRepo makes dir/cluster.git, a bare repository whose main
// branch holds a small cluster.yaml, at git's default settings (plus
// allowAnySHA1InWant for server "anysha1").
func makeServerRepo(ctx context.Context, dir, server string) (string, error) {
	work, bare := filepath.Join(dir, "work"), filepath.Join(dir, "srv", "cluster.git")
	gitc := func(d string, args ...string) error {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = d
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
			"GIT_AUTHOR_NAME=scale", "GIT_AUTHOR_EMAIL=scale@keel.invalid", "GIT_COMMITTER_NAME=scale", "GIT_COMMITTER_EMAIL=scale@keel.invalid")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %v: %w: %s", args, err, out)
		}
		return nil
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return "", err
	}
	cluster := "apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: scale}\nspec:\n  podCIDR: 10.200.0.0/16\n  serviceCIDR: 10.201.0.0/16\n"
	if err := os.WriteFile(filepath.Join(work, "cluster.yaml"), []byte(cluster), 0o600); err != nil {
		return "", err
	}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"commit", "-q", "-m", "cluster"}, {"clone", "-q", "--bare", work, bare}} {
		if err := gitc(work, args...); err != nil {
			return "", err
		}
	}
	switch server {
	case "default":
	case "anysha1":
		if err := gitc(bare, "config", "uploadpack.allowAnySHA1InWant", "true"); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("server %q: want default or anysha1", server)
	}
	return bare, nil
}

// makeReport is a realistic report: 20 instances, about 4 KB.
func makeReport(name string, version int, when time.Time) []byte {
	r := report.Report{Node: name, Time: when, AgentVersion: "0.1.0", Commit: strings.Repeat("ab", 20),
		PlanID: fmt.Sprintf("%016x", version), Capacity: report.Capacity{}}
	for i := range 20 {
		r.Instances = append(r.Instances, report.Instance{
			Name: fmt.Sprintf("web-%s-%02d", name, i), State: report.StateRunning,
			Address:  netip.AddrFrom4([4]byte{10, 200, byte(i), byte(version)}),
			SpecHash: fmt.Sprintf("%064x", version*100+i), Restarts: version % 3,
		})
	}
	return r.Marshal()
}

// seedTimeout bounds each seeding push (seed): on a busy machine a smoke
// run's 3 s (three of its 1 s intervals) was not always enough.
const seedTimeout = time.Minute

// do runs one git operation under the in-flight bound and records it; it
// gives up after three report intervals.
func (h *harness) do(ctx context.Context, kind string, f func(context.Context) error) error {
	return h.doWithin(ctx, kind, 3*h.cfg.interval, f)
}

// doWithin is do, giving up after bound.
func (h *harness) doWithin(ctx context.Context, kind string, bound time.Duration, f func(context.Context) error) error {
	t0 := time.Now()
	select {
	case h.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	t1 := time.Now()
	opCtx, cancel := context.WithTimeout(ctx, bound)
	err := f(opCtx)
	cancel()
	<-h.sem
	if ctx.Err() != nil {
		return ctx.Err() // the run ended: not a failure
	}
	h.st.op(kind, time.Since(t1), time.Since(t0), err, h.cfg.interval)
	return err
}

func (h *harness) runNode(ctx context.Context, n *node, offset time.Duration) {
	select {
	case <-time.After(offset):
	case <-ctx.Done():
		return
	}
	publish := func() {
		data := makeReport(n.name, n.version, time.Now())
		_ = h.do(ctx, "publish", func(ctx context.Context) error {
			_, err := n.pub.Publish(ctx, n.name, data, time.Now())
			return err
		})
		if n.pub.NeedsCompaction() {
			_ = n.pub.Prune()
		}
	}
	if h.cfg.mode == "poll" {
		tick := time.NewTicker(h.cfg.interval)
		defer tick.Stop()
		for {
			publish()
			_ = h.do(ctx, "fetch", func(ctx context.Context) error {
				_, err := n.fetch.Fetch(ctx)
				return err
			})
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
		}
	}
	// Gossip mode (seeded: every node has version 0 of every report):
	// fetches follow the notices.
	heartbeat := time.NewTicker(h.cfg.heartbeat)
	defer heartbeat.Stop()
	// The safety poll runs in its own phase, as an agent's does (its
	// poll timer is not its report timer).
	safety := time.NewTimer(time.Duration(rand.Int64N(int64(h.cfg.safetyPoll))))
	defer safety.Stop()
	var change <-chan time.Time
	nextChange := func() {
		if h.cfg.churn > 0 {
			change = time.After(time.Duration(rand.ExpFloat64() / h.cfg.churn * float64(time.Minute)))
		}
	}
	nextChange()
	for {
		select {
		case <-ctx.Done():
			return
		case <-change:
			n.version++
			h.announce(ctx, n)
			nextChange()
		case <-heartbeat.C:
			publish() // same content, new time: no notice
		case <-safety.C:
			h.fetchChanged(ctx, n)
			safety.Reset(h.cfg.safetyPoll)
		case <-n.wake:
			h.fetchChanged(ctx, n)
		}
	}
}

// announce publishes n's report and delivers the notice of its new
// content version to every other node after a random delay: the simulated
// gossip.
func (h *harness) announce(ctx context.Context, n *node) {
	data := makeReport(n.name, n.version, time.Now())
	if err := h.do(ctx, "publish", func(ctx context.Context) error {
		_, err := n.pub.Publish(ctx, n.name, data, time.Now())
		return err
	}); err != nil {
		return
	}
	v := n.version
	for _, p := range h.nodes {
		if p == n {
			continue
		}
		h.timers.Add(1)
		time.AfterFunc(time.Duration(rand.Int64N(int64(h.cfg.maxDelay)+1)), func() {
			defer h.timers.Done()
			p.mu.Lock()
			if old, ok := p.heard[n.name]; !ok || v > old {
				p.heard[n.name] = v
			}
			p.mu.Unlock()
			select {
			case p.wake <- struct{}{}: // notices merge while a fetch is in flight
			default:
			}
		})
	}
}

// fetchChanged fetches the reports whose announced version differs from
// the one n has, and the reports of nodes gossip does not know.
func (h *harness) fetchChanged(ctx context.Context, n *node) {
	pending := map[string]int{}
	want := func(ref plumbing.ReferenceName, _ plumbing.Hash) bool {
		peer, ok := strings.CutPrefix(ref.String(), prefix)
		if !ok {
			return true // certificates: none here
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		heard, known := n.heard[peer]
		have, fetched := n.have[peer]
		if known && fetched && heard == have {
			return false
		}
		pending[peer] = heard
		return true
	}
	if err := h.do(ctx, "fetch", func(ctx context.Context) error {
		_, err := n.fetch.FetchChanged(ctx, want)
		return err
	}); err != nil {
		return
	}
	n.mu.Lock()
	for peer, v := range pending {
		n.have[peer] = v
	}
	n.mu.Unlock()
}

// sample is what the process and the server's repository measured at one time.
type sample struct {
	at              time.Time
	children, self  time.Duration
	du              int64
	objects, packed int64
	looseKB, packKB int64
	load            string
}

// takeSample measures the repository and the CPU; with cpuFirst the CPU
// is read before the repository is measured, else after, so that the
// du and git count-objects children of neither sample count in the
// difference.
func takeSample(bare string, cpuFirst bool) (sample, error) {
	s := sample{at: time.Now()}
	if !cpuFirst {
		if err := s.measureRepo(bare); err != nil {
			return s, err
		}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		return s, err
	}
	s.children = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return s, err
	}
	s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if cpuFirst {
		if err := s.measureRepo(bare); err != nil {
			return s, err
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		s.load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return s, nil
}

func (s *sample) measureRepo(bare string) error {
	s.du = diskUsage(bare)
	cmd := exec.Command("git", "count-objects", "-v")
	cmd.Dir = bare
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("git count-objects: %w", err)
	}
	for line := range strings.Lines(string(out)) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ": ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "count":
			s.objects = n
		case "in-pack":
			s.packed = n
		case "size":
			s.looseKB = n
		case "size-pack":
			s.packKB = n
		}
	}
	return nil
}

// diskUsage is what du -s counts: the blocks of every file under dir. A
// file that vanishes during the walk (a push's temporary objects) is not
// counted; du would fail on it.
func diskUsage(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

// TableHeader is the header of the markdown table print writes rows of.
const tableHeader = "| nodes | mode | server | server CPU ms/node/min | server cores | client cores | fetch p50/p95 | publish p50/p95 | KB/fetch | req/s | fetches | publishes | missed | failed fetch/publish | repo growth MB/min | loose objects/min | load (1/5/15) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"

func (h *harness) print(out io.Writer, before, after sample, steady time.Duration) error {
	st := h.st
	st.mu.Lock()
	defer st.mu.Unlock()
	mins := steady.Minutes()
	server := after.children - before.children
	client := after.self - before.self
	perFetch := 0.0
	if st.fetches > 0 {
		perFetch = float64(st.fetchBytes.Load()) / float64(st.fetches) / 1024
	}
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	mode := h.cfg.mode
	if mode == "gossip" && h.cfg.churn > 0 {
		mode += fmt.Sprintf(", churn %g/min", h.cfg.churn)
	}
	row := fmt.Sprintf("| %d | %s | %s | %.0f | %.2f | %.2f | %s/%s ms | %s/%s ms | %.1f | %.1f | %d | %d | %d | %d/%d | %.2f | %.0f | %s |\n",
		h.cfg.nodes, mode, h.cfg.server,
		float64(server.Milliseconds())/float64(h.cfg.nodes)/mins, server.Seconds()/steady.Seconds(), client.Seconds()/steady.Seconds(),
		ms(pct(st.fetchLat, .5)), ms(pct(st.fetchLat, .95)), ms(pct(st.publishLat, .5)), ms(pct(st.publishLat, .95)),
		perFetch, float64(st.requests.Load())/steady.Seconds(), st.fetches, st.publishes, st.missed, st.failedFetch, st.failedPub,
		float64(after.du-before.du)/(1<<20)/mins, float64(after.objects-before.objects)/mins, after.load)
	fmt.Fprintf(out, "steady state %.0f s: server (git children) %.1f s CPU, client (this process: go-git nodes and the HTTP front) %.1f s CPU\n",
		steady.Seconds(), server.Seconds(), client.Seconds())
	fmt.Fprintf(out, "server repository: %d KiB -> %d KiB on disk; loose objects %d -> %d; packed %d -> %d\n",
		before.du>>10, after.du>>10, before.objects, after.objects, before.packed, after.packed)
	if st.firstErr != "" {
		fmt.Fprintf(out, "first failure: %s\n", st.firstErr)
	}
	fmt.Fprint(out, tableHeader, row)
	if h.cfg.table == "" {
		return nil
	}
	f, err := os.OpenFile(h.cfg.table, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(row)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
