//go:build linux

package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	gosync "sync"
	"time"
)

// A load generator for the zero-downtime tests: clients that send GETs to
// a Service's VIP at a steady rate, as real clients do, and record every
// request: when, how long, and how it ended.
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

// loadOptions describe a load.
type loadOptions struct {
	Target    string        // host:port, the VIP
	Rate      float64       // requests per second of the keepAlive and fresh clients together
	KeepAlive int           // clients on one kept-alive connection each
	Fresh     int           // clients with a new connection per request
	Slow      int           // keepAlive clients whose requests take SlowDelay (outside Rate)
	SlowDelay time.Duration // the server-side delay of a slow client's request
	Timeout   time.Duration // per request; a request that takes longer fails
}

// sample is one request.
type sample struct {
	At       time.Duration // since the load started
	Latency  time.Duration
	Kind     string // keepAlive, fresh, slow
	Client   int
	Err      string // empty on success
	Greeting string // of the answer, on success
	Replica  string // the instance that answered, on success
}

// load is a running load generator; stop ends it.
type load struct {
	opts   loadOptions
	start  time.Time
	stopCh chan struct{}
	wg     gosync.WaitGroup
	once   gosync.Once

	mu      gosync.Mutex
	samples []sample
	marks   []mark
}

// mark names a moment of the load (a commit, say), for the report.
type mark struct {
	At   time.Duration
	What string
}

// startLoad starts the clients. The caller must call stop, which waits for
// every client (each ends its request in flight, bounded by Timeout).
func startLoad(opts loadOptions) *load {
	if opts.Timeout == 0 {
		opts.Timeout = scaled(10 * time.Second)
	}
	l := &load{opts: opts, start: time.Now(), stopCh: make(chan struct{})}
	paced := opts.KeepAlive + opts.Fresh
	interval := time.Duration(0)
	if paced > 0 && opts.Rate > 0 {
		interval = time.Duration(float64(paced) / opts.Rate * float64(time.Second))
	}
	id := 0
	add := func(n int, kind string, keepAlive bool, path string, every time.Duration) {
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
				l.run(client, c, kind, path, offset, every)
			})
		}
	}
	add(opts.KeepAlive, "keepAlive", true, "/", interval)
	add(opts.Fresh, "fresh", false, "/", interval)
	add(opts.Slow, "slow", true, "/?delay="+opts.SlowDelay.String(), 0)
	return l
}

// run is one client's loop: a request every `every` (back to back when 0),
// never catching up on requests a slow answer delayed.
func (l *load) run(client *http.Client, id int, kind, path string, offset, every time.Duration) {
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
		s := l.get(client, path)
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

// get sends one request. It is not cancelled by stop: a request in flight
// ends by itself, within Timeout.
func (l *load) get(client *http.Client, path string) sample {
	begin := time.Now()
	s := sample{At: begin.Sub(l.start)}
	err := func() error {
		req, err := http.NewRequestWithContext(context.Background(), "GET", "http://"+l.opts.Target+path, nil)
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

// mark records a moment of the load.
func (l *load) mark(what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.marks = append(l.marks, mark{At: time.Since(l.start), What: what})
}

// stop stops the clients, waits for them, and returns what they saw. It
// may be called more than once.
func (l *load) stop() loadResult {
	l.once.Do(func() { close(l.stopCh) })
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return loadResult{Samples: slices.Clone(l.samples), Marks: slices.Clone(l.marks), Start: l.start, Duration: time.Since(l.start)}
}

// loadResult is every request of a load.
type loadResult struct {
	Samples  []sample
	Marks    []mark
	Start    time.Time // the wall clock, to compare with the agents' logs
	Duration time.Duration
}

// loadStats sum up some of a load's requests.
type loadStats struct {
	Sent, Failed int
	P50, P99     time.Duration
	Errors       []string       // the first few failures, with when and which client
	Greetings    map[string]int // answers by greeting
	Replicas     map[string]int // answers by replica
}

// stats sums up the requests (every one when filter is nil). The
// latencies are those of the successful requests.
func (r loadResult) stats(filter func(sample) bool) loadStats {
	st := loadStats{Greetings: map[string]int{}, Replicas: map[string]int{}}
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

// summary is a report of the load for the test's log: totals, by kind of
// client, the marks, and the first failures.
func (r loadResult) summary() string {
	var b strings.Builder
	all, paced := r.stats(nil), r.stats(isPaced)
	fmt.Fprintf(&b, "from %s: %d requests in %s (%.0f/s), %d failed, paced requests' p50 %s, p99 %s; answers by greeting %v, by replica %v",
		r.Start.Format("15:04:05.000"), all.Sent, r.Duration.Round(time.Millisecond), float64(all.Sent)/r.Duration.Seconds(), all.Failed,
		paced.P50.Round(10*time.Microsecond), paced.P99.Round(10*time.Microsecond), all.Greetings, sortedCounts(all.Replicas))
	for _, kind := range []string{"keepAlive", "fresh", "slow"} {
		k := r.stats(func(s sample) bool { return s.Kind == kind })
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

// sofar sums up the requests sent until now, while the load runs.
func (l *load) sofar() loadStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return loadResult{Samples: l.samples}.stats(nil)
}

// markAt is when the mark named what was made (the end of the load when
// there is none).
func (r loadResult) markAt(what string) time.Duration {
	for _, m := range r.Marks {
		if m.What == what {
			return m.At
		}
	}
	return r.Duration
}

// isPaced: the requests of the clients at a steady rate, whose latency
// is the service's (a slow client's is the delay it asked for).
func isPaced(s sample) bool { return s.Kind != "slow" }

// before sums up the paced requests sent before the mark named what.
func (r loadResult) before(what string) loadStats {
	at := r.markAt(what)
	return r.stats(func(s sample) bool { return isPaced(s) && s.At < at })
}

// after sums up the paced requests sent from the mark named what on.
func (r loadResult) after(what string) loadStats {
	at := r.markAt(what)
	return r.stats(func(s sample) bool { return isPaced(s) && s.At >= at })
}
