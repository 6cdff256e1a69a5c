// Package loadgen is a load generator for a Service that runs keel's demo
// web application (demo-web): clients that send GETs to its VIP at a
// steady rate, as real clients do, and record every request: when, how
// long, and how it ended. The zero-downtime tests and benchmarks run it,
// and so does `keel demo-load`, the demo's load loop.
//
// Three kinds of client run side by side:
//
//   - keepAlive clients each keep one connection open (an http.Transport of
//     their own) and send their requests on it, as a browser or a service's
//     HTTP client library does. Through the node's L4 proxy, such a
//     connection stays with the replica it was first relayed to until one
//     side closes it: when the replica shuts down gracefully it closes the
//     idle connection, and the client opens a new one. Go's Transport
//     itself retries an idempotent request (a GET) once when a reused
//     connection turns out closed before any byte of the answer came back
//     (the race of the server closing an idle connection as the request
//     leaves); that retry is what every HTTP/1.1 client does, and the load
//     generator adds none of its own.
//   - fresh clients open a new connection for every request (a curl loop):
//     each request goes through a proxy's choice of endpoint, so any
//     endpoint list that still names a stopped, or not yet listening,
//     replica shows as failures; nothing retries them.
//   - slow clients keep one connection and ask for /?delay=D: every
//     request is in flight for D, so that some are in flight on a replica
//     when it is drained and sent SIGTERM, and must still get their
//     answer.
//
// A request fails when the transport returns an error, the status is not
// 200, or the body is not demo-web's greeting line.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	gosync "sync"
	"time"
)

// Options describe a load.
type Options struct {
	URL       string        // what every request asks for: http://VIP:port/ (a slow client's adds ?delay=)
	Rate      float64       // requests per second of the keepAlive and fresh clients together
	KeepAlive int           // clients on one kept-alive connection each
	Fresh     int           // clients with a new connection per request
	Slow      int           // keepAlive clients whose requests take SlowDelay (outside Rate)
	SlowDelay time.Duration // the server-side delay of a slow client's request
	Timeout   time.Duration // per request (default 10 s); a request that takes longer fails
}

// Sample is one request.
type Sample struct {
	At       time.Duration // since the load started
	Latency  time.Duration
	Kind     string // keepAlive, fresh, slow
	Client   int
	Err      string // empty on success
	Greeting string // of the answer, on success
	Replica  string // the instance that answered, on success
}

// Load is a running load generator; Stop ends it.
type Load struct {
	opts   Options
	start  time.Time
	stopCh chan struct{}
	wg     gosync.WaitGroup
	once   gosync.Once

	mu      gosync.Mutex
	samples []Sample
	marks   []Mark
}

// Mark names a moment of the load (a commit, say), for the report.
type Mark struct {
	At   time.Duration
	What string
}

// Start starts the clients. The caller must call Stop, which waits for
// every client (each ends its request in flight, bounded by Timeout).
func Start(opts Options) (*Load, error) {
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Second
	}
	u, err := url.Parse(opts.URL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("load: %q is not an http:// URL", opts.URL)
	}
	if opts.Rate < 0 || opts.KeepAlive < 0 || opts.Fresh < 0 || opts.Slow < 0 || opts.KeepAlive+opts.Fresh+opts.Slow == 0 {
		return nil, errors.New("load: no clients, or a negative rate or count")
	}
	q := u.Query()
	q.Set("delay", opts.SlowDelay.String())
	slow := *u
	slow.RawQuery = q.Encode()
	l := &Load{opts: opts, start: time.Now(), stopCh: make(chan struct{})}
	paced := opts.KeepAlive + opts.Fresh
	interval := time.Duration(0)
	if paced > 0 && opts.Rate > 0 {
		interval = time.Duration(float64(paced) / opts.Rate * float64(time.Second))
	}
	id := 0
	add := func(n int, kind string, keepAlive bool, target string, every time.Duration) {
		for range n {
			client := &http.Client{
				Timeout: opts.Timeout,
				Transport: &http.Transport{
					Proxy:               nil,
					DisableKeepAlives:   !keepAlive,
					MaxIdleConnsPerHost: 1,
				},
			}
			// Spread the clients' first requests over one interval, so
			// that the load is steady rather than in bursts.
			offset := time.Duration(0)
			if paced > 0 {
				offset = every * time.Duration(id) / time.Duration(paced)
			}
			c := id
			id++
			l.wg.Go(func() {
				defer client.CloseIdleConnections()
				l.run(client, c, kind, target, offset, every)
			})
		}
	}
	add(opts.KeepAlive, "keepAlive", true, opts.URL, interval)
	add(opts.Fresh, "fresh", false, opts.URL, interval)
	add(opts.Slow, "slow", true, slow.String(), 0)
	return l, nil
}

// run is one client's loop: a request every `every` (back to back when 0),
// never catching up on requests a slow answer delayed.
func (l *Load) run(client *http.Client, id int, kind, target string, offset, every time.Duration) {
	next := l.start.Add(offset)
	for {
		if wait := time.Until(next); wait > 0 {
			t := time.NewTimer(wait) // the pacing of a steady load, not a wait for a condition
			select {
			case <-l.stopCh:
				t.Stop()
				return
			case <-t.C:
			}
		} else {
			select {
			case <-l.stopCh:
				return
			default:
			}
		}
		s := l.get(client, target)
		s.Kind, s.Client = kind, id
		l.mu.Lock()
		l.samples = append(l.samples, s)
		l.mu.Unlock()
		next = next.Add(every)
		if now := time.Now(); next.Before(now) {
			next = now
		}
	}
}

// greetingLine is demo-web's answer.
var greetingLine = regexp.MustCompile(`^(\S+) from (\S+) on node (\S+) \(request \d+\)\n$`)

// get sends one request. It is not cancelled by Stop: a request in flight
// ends by itself, within Timeout.
func (l *Load) get(client *http.Client, target string) Sample {
	begin := time.Now()
	s := Sample{At: begin.Sub(l.start)}
	err := func() error {
		req, err := http.NewRequestWithContext(context.Background(), "GET", target, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if err != nil {
			return fmt.Errorf("%s, reading the body: %w", resp.Status, err)
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %q", resp.Status, body)
		}
		m := greetingLine.FindStringSubmatch(string(body))
		if m == nil {
			return fmt.Errorf("not a greeting: %q", body)
		}
		s.Greeting, s.Replica = m[1], m[2]
		return nil
	}()
	s.Latency = time.Since(begin)
	if err != nil {
		s.Err = err.Error()
	}
	return s
}

// Mark records a moment of the load.
func (l *Load) Mark(what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marks = append(l.marks, Mark{At: time.Since(l.start), What: what})
}

// Stop stops the clients, waits for them, and returns what they saw. It
// may be called more than once.
func (l *Load) Stop() Result {
	l.once.Do(func() { close(l.stopCh) })
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return Result{Samples: slices.Clone(l.samples), Marks: slices.Clone(l.marks), Start: l.start, Duration: time.Since(l.start)}
}

// Result is every request of a load.
type Result struct {
	Samples  []Sample
	Marks    []Mark
	Start    time.Time // the wall clock, to compare with the agents' logs
	Duration time.Duration
}

// Stats sum up some of a load's requests.
type Stats struct {
	Sent, Failed int
	P50, P99     time.Duration
	Errors       []string       // the first few failures, with when and which client
	Greetings    map[string]int // answers by greeting
	Replicas     map[string]int // answers by replica
}

// Stats sums up the requests (every one when filter is nil). The
// latencies are those of the successful requests.
func (r Result) Stats(filter func(Sample) bool) Stats {
	st := Stats{Greetings: map[string]int{}, Replicas: map[string]int{}}
	var lat []time.Duration
	for _, s := range r.Samples {
		if filter != nil && !filter(s) {
			continue
		}
		st.Sent++
		if s.Err != "" {
			st.Failed++
			if len(st.Errors) < 10 {
				st.Errors = append(st.Errors, fmt.Sprintf("at %s, %s client %d: %s", s.At.Round(time.Millisecond), s.Kind, s.Client, s.Err))
			}
			continue
		}
		st.Greetings[s.Greeting]++
		st.Replicas[s.Replica]++
		lat = append(lat, s.Latency)
	}
	slices.Sort(lat)
	st.P50, st.P99 = percentile(lat, 0.50), percentile(lat, 0.99)
	return st
}

// percentile of sorted durations (nearest rank); 0 when there are none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Summary is a report of the load for the test's log: totals, by kind of
// client, the marks, and the first failures.
func (r Result) Summary() string {
	var b strings.Builder
	all, paced := r.Stats(nil), r.Stats(IsPaced)
	fmt.Fprintf(&b, "from %s: %d requests in %s (%.0f/s), %d failed, paced requests' p50 %s, p99 %s; answers by greeting %v, by replica %v",
		r.Start.Format("15:04:05.000"), all.Sent, r.Duration.Round(time.Millisecond), float64(all.Sent)/r.Duration.Seconds(), all.Failed,
		paced.P50.Round(10*time.Microsecond), paced.P99.Round(10*time.Microsecond), all.Greetings, sortedCounts(all.Replicas))
	for _, kind := range []string{"keepAlive", "fresh", "slow"} {
		k := r.Stats(func(s Sample) bool { return s.Kind == kind })
		if k.Sent > 0 {
			fmt.Fprintf(&b, "\n  %s clients: %d requests, %d failed, p50 %s, p99 %s", kind, k.Sent, k.Failed, k.P50.Round(10*time.Microsecond), k.P99.Round(10*time.Microsecond))
		}
	}
	for _, m := range r.Marks {
		fmt.Fprintf(&b, "\n  at %s: %s", m.At.Round(time.Millisecond), m.What)
	}
	for _, e := range all.Errors {
		fmt.Fprintf(&b, "\n  failed %s", e)
	}
	return b.String()
}

func sortedCounts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s:%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// SoFar sums up the requests sent until now, while the load runs.
func (l *Load) SoFar() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Result{Samples: l.samples}.Stats(nil)
}

// MarkAt is when the mark named what was made (the end of the load when
// there is none).
func (r Result) MarkAt(what string) time.Duration {
	for _, m := range r.Marks {
		if m.What == what {
			return m.At
		}
	}
	return r.Duration
}

// IsPaced: the requests of the clients at a steady rate, whose latency
// is the service's (a slow client's is the delay it asked for).
func IsPaced(s Sample) bool { return s.Kind != "slow" }

// Before sums up the paced requests sent before the mark named what.
func (r Result) Before(what string) Stats {
	at := r.MarkAt(what)
	return r.Stats(func(s Sample) bool { return IsPaced(s) && s.At < at })
}

// After sums up the paced requests sent from the mark named what on.
func (r Result) After(what string) Stats {
	at := r.MarkAt(what)
	return r.Stats(func(s Sample) bool { return IsPaced(s) && s.At >= at })
}
