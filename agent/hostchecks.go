package agent

import (
	"context"
	"log/slog"
	"slices"
	gosync "sync"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/report"
)

// DefaultCheckInterval is how often the driver's host checks run when
// Options.CheckInterval is zero.
const DefaultCheckInterval = time.Minute

// checkTimeout bounds one run of the host checks.
const checkTimeout = 30 * time.Second

// hostChecks runs the driver's host checks (nodeexec.HostChecker) on a
// goroutine of its own, every interval, so that a slow check never holds
// up the loop. It logs each problem once when it appears and once when it
// clears, keeps the problems for the node's report, and sets
// keel_node_problem. A run that fails keeps what the last one found.
//
// run is called once by the loop before the goroutine starts; current is
// safe for concurrent use; close stops the goroutine and waits for it.
type hostChecks struct {
	checker  nodeexec.HostChecker
	log      *slog.Logger
	metrics  *Metrics
	interval time.Duration

	mu       gosync.Mutex
	found    []nodeexec.HostProblem // as the last run that worked found them
	problems []report.Problem       // found, as the report lists them
	lastErr  string                 // the last run's error, logged when it changes

	cancel context.CancelFunc
	wg     gosync.WaitGroup
}

func newHostChecks(checker nodeexec.HostChecker, log *slog.Logger, metrics *Metrics, interval time.Duration) *hostChecks {
	if interval <= 0 {
		interval = DefaultCheckInterval
	}
	for _, c := range report.Checks {
		metrics.NodeProblems.WithLabelValues(c).Set(0)
	}
	return &hostChecks{checker: checker, log: log, metrics: metrics, interval: interval, cancel: func() {}}
}

// start runs the checks every interval until close.
func (h *hostChecks) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(h.interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				h.run(ctx)
			}
		}
	}()
}

func (h *hostChecks) close() {
	h.cancel()
	h.wg.Wait()
}

// run runs the checks once and takes in what they found.
func (h *hostChecks) run(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	found, err := h.checker.Check(cctx)
	cancel()
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return // cut short by the shutdown: not news
		}
		if msg := err.Error(); msg != h.lastErr {
			h.lastErr = msg
			h.log.Warn("host checks failed; keeping the problems last found", "err", err)
		}
		return
	}
	if h.lastErr != "" {
		h.lastErr = ""
		h.log.Info("host checks work again")
	}
	for _, p := range found {
		if !slices.Contains(h.found, p) {
			h.log.Warn("host problem", "check", p.Check, "problem", p.Problem, "fix", p.Fix)
		}
	}
	for _, p := range h.found {
		if !slices.Contains(found, p) {
			h.log.Info("host problem cleared", "check", p.Check, "problem", p.Problem)
		}
	}
	rps := make([]report.Problem, 0, len(found))
	for _, p := range found {
		rps = append(rps, report.Problem(p))
	}
	problems, dropped := report.TrimProblems(rps)
	if dropped > 0 && !slices.Equal(found, h.found) {
		h.log.Warn("host problems left out of the report: their check is not one the report format knows, or they have no text, or there are too many",
			"dropped", dropped)
	}
	h.found, h.problems = slices.Clone(found), problems
	counts := map[string]int{}
	for _, p := range problems {
		counts[p.Check]++
	}
	for _, c := range report.Checks {
		h.metrics.NodeProblems.WithLabelValues(c).Set(float64(counts[c]))
	}
}

// current returns the problems for the node's report.
func (h *hostChecks) current() []report.Problem {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.problems)
}
