package acme

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	xacme "golang.org/x/crypto/acme"

	"github.com/keel-dev/keel/internal/pebble"
	"github.com/keel-dev/keel/providers"
	"github.com/keel-dev/keel/providers/providertest"
)

func newManager(t *testing.T, opts ManagerOptions) *Manager {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	m, err := NewManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TestManagerRenewsAShortLivedCertificate: Pebble issues certificates of
// 6 s; the Manager renews each at two thirds of its life, with a new key
// and serial, and hands each to OnIssued.
func TestManagerRenewsAShortLivedCertificate(t *testing.T) {
	c := startCA(t, pebble.Options{Validity: 6 * time.Second})
	var got issued
	reg := prometheus.NewRegistry()
	m := newManager(t, ManagerOptions{
		Issuer: c.issuer(t, t.TempDir()), OnIssued: got.add, Registry: reg,
		RetryBase: 100 * time.Millisecond, RetryMax: time.Second,
	})
	m.Set([]Want{{Host: "web.example.com", Email: "ops@example.com", Solver: c.http}})
	waitFor(t, 40*time.Second, "a certificate and its renewal", func() bool { return len(got.get()) >= 2 })
	m.Close()

	bs := got.get()
	first, second := bs[0], bs[1]
	if first.Serial == second.Serial || string(first.KeyPEM) == string(second.KeyPEM) {
		t.Fatal("the renewal reused the serial or the key")
	}
	// Renewed when due, not before: certificate times are whole seconds.
	if second.NotBefore.Before(first.RenewAt().Truncate(time.Second)) {
		t.Fatalf("renewed at %s, before the first certificate's renewal time %s", second.NotBefore, first.RenewAt())
	}
	for _, b := range bs {
		serveTLS(t, b, c.IssuingRoots)
	}
	last := bs[len(bs)-1]
	st, _ := statusOf(m, "web.example.com")
	if st.Serial != last.Serial || !st.NotAfter.Equal(last.NotAfter) || st.LastError != "" || st.Failures != 0 {
		t.Fatalf("status %+v, want the last certificate %s", st, last.Serial)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(`
# HELP keel_certificate_renewals_total ACME orders for a host's certificate, by result (issued, failed).
# TYPE keel_certificate_renewals_total counter
keel_certificate_renewals_total{host="web.example.com",result="issued"} %d
`, len(bs)))); err != nil {
		t.Fatal(err)
	}
}

// TestManagerBacksOffWhileTheCurrentCertificateStays: the DNS provider
// fails; the Manager retries with waits that double up to the cap, keeps
// reporting the certificate it has, and issues once the provider works.
func TestManagerBacksOffWhileTheCurrentCertificateStays(t *testing.T) {
	c := startCA(t, pebble.Options{})
	dns := &challDNS{srv: c.Server, fail: func(string) error { return errDNSDown }}
	var got issued
	reg := prometheus.NewRegistry()
	const base, cap = 20 * time.Millisecond, 160 * time.Millisecond
	m := newManager(t, ManagerOptions{
		Issuer: c.issuer(t, t.TempDir()), OnIssued: got.add, Registry: reg,
		RetryBase: base, RetryMax: cap,
	})
	// Valid for a day more: due, but still served.
	now := time.Now()
	current := providertest.SelfSigned(t, "shop.example.com", now.Add(-89*24*time.Hour), now.Add(24*time.Hour))
	m.Set([]Want{{Host: "shop.example.com", Current: current, Solver: DNS01(dns)}})

	// Every wait the Manager plans after a failure is within the
	// jittered bounds of its doubling, never above the cap.
	sawCapped := false
	waitFor(t, 30*time.Second, "seven failed orders", func() bool {
		st, err := statusOf(m, "shop.example.com")
		if err != nil {
			t.Fatal(err)
		}
		if st.Failures > 0 && !st.NextAttempt.IsZero() {
			wait := st.NextAttempt.Sub(st.LastAttempt)
			want := min(base<<(st.Failures-1), cap)
			if wait < want/2 || wait > cap || wait > want*3/2 {
				t.Fatalf("after %d failures the Manager waits %s, want %s ±50%% and at most %s", st.Failures, wait, want, cap)
			}
			sawCapped = sawCapped || st.Failures >= 5
		}
		if st.Serial != current.Serial || !st.NotAfter.Equal(current.NotAfter) {
			t.Fatalf("status reports %s, want the current certificate %s", st.Serial, current.Serial)
		}
		return st.Failures >= 7 && sawCapped
	})
	presents, _ := dns.calls()
	for k := 1; k < len(presents); k++ {
		// Real time can only be longer than planned.
		if gap, least := presents[k].Sub(presents[k-1]), min(base<<(k-1), cap)/2; gap < least {
			t.Errorf("attempt %d came %s after the one before, less than %s", k+1, gap, least)
		}
	}
	st, _ := statusOf(m, "shop.example.com")
	if !strings.Contains(st.LastError, errDNSDown.Error()) {
		t.Fatalf("last error %q", st.LastError)
	}
	if n := len(got.get()); n != 0 {
		t.Fatalf("OnIssued called %d times while every order failed", n)
	}
	failed := testutil.ToFloat64(m.metrics.renewals.WithLabelValues("shop.example.com", resultFailed))
	if failed < 7 {
		t.Fatalf("failed orders counted %v", failed)
	}

	// The provider recovers: the next retry issues.
	dns.mu.Lock()
	dns.fail = nil
	dns.mu.Unlock()
	waitFor(t, 30*time.Second, "the certificate once DNS works", func() bool { return len(got.get()) == 1 })
	waitFor(t, 5*time.Second, "the status to follow", func() bool {
		st, _ := statusOf(m, "shop.example.com")
		return st.Serial == got.get()[0].Serial && st.LastError == "" && st.Failures == 0 &&
			st.NextAttempt.Equal(got.get()[0].RenewAt())
	})
	serveTLS(t, got.get()[0], c.IssuingRoots)
}

// TestOneHostsFailureLeavesTheOthers: three hosts, one whose DNS fails,
// at most one order at a time: the two others are issued, the third
// keeps failing on its own.
func TestOneHostsFailureLeavesTheOthers(t *testing.T) {
	c := startCA(t, pebble.Options{})
	failing := &challDNS{srv: c.Server, fail: func(string) error { return errDNSDown }}
	var got issued
	m := newManager(t, ManagerOptions{
		Issuer: c.issuer(t, t.TempDir()), OnIssued: got.add, MaxConcurrent: 1,
		RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond,
	})
	hold := make(chan struct{})
	c.http.mu.Lock()
	c.http.hold = hold
	c.http.mu.Unlock()
	m.Set([]Want{
		{Host: "a.example.com", Solver: c.http},
		{Host: "b.example.com", Solver: c.http},
		{Host: "c.example.com", Solver: DNS01(failing)},
	})
	waitFor(t, 10*time.Second, "the first HTTP-01 Present", func() bool { p, _, _, _ := c.http.counts(); return p == 1 })
	// While that order holds the only slot, no other order starts. (A
	// negative: it can pass wrongly on a slow machine, never fail so.)
	dnsBefore, _ := failing.calls()
	time.Sleep(300 * time.Millisecond)
	if p, _, _, _ := c.http.counts(); p != 1 {
		t.Fatalf("%d HTTP-01 Presents with one order slot held", p)
	}
	if presents, _ := failing.calls(); len(presents) != len(dnsBefore) {
		t.Fatalf("%d DNS-01 Presents while one order slot was held", len(presents)-len(dnsBefore))
	}
	close(hold)
	waitFor(t, 30*time.Second, "a and b issued", func() bool {
		return len(got.forHost("a.example.com")) == 1 && len(got.forHost("b.example.com")) == 1
	})
	waitFor(t, 10*time.Second, "c failing again", func() bool {
		st, _ := statusOf(m, "c.example.com")
		return st.Failures >= 2
	})
	if _, _, most, _ := c.http.counts(); most != 1 {
		t.Fatalf("%d HTTP-01 Presents at once with MaxConcurrent 1", most)
	}
	for _, st := range m.Status() {
		switch st.Host {
		case "a.example.com", "b.example.com":
			if st.LastError != "" || st.Serial == "" {
				t.Errorf("%s: %+v", st.Host, st)
			}
		case "c.example.com":
			if st.Serial != "" || !strings.Contains(st.LastError, errDNSDown.Error()) {
				t.Errorf("%s: %+v", st.Host, st)
			}
		}
	}
	if n := len(got.forHost("c.example.com")); n != 0 {
		t.Fatalf("c issued %d times", n)
	}
}

// TestManagerSurvivesPebbleChaos: Pebble rejects half the nonces, sleeps
// before validating, reuses authorizations half the time, and the first
// two validations fail (the HTTP-01 answer is stale, as from a node that
// lags); the Manager retries until it has the certificate.
func TestManagerSurvivesPebbleChaos(t *testing.T) {
	c := startCA(t, pebble.Options{
		NonceReject: 50, AuthzReuse: 50, VASleep: true,
		Env: []string{"PEBBLE_VA_SLEEPTIME=2"}, // 0 or 1 s
	})
	c.http.mu.Lock()
	c.http.wrong = 2
	c.http.mu.Unlock()
	var got issued
	m := newManager(t, ManagerOptions{
		Issuer: c.issuer(t, t.TempDir()), OnIssued: got.add,
		RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond,
	})
	m.Set([]Want{{Host: "chaos.example.com", Solver: c.http}})
	waitFor(t, 40*time.Second, "a certificate through the chaos", func() bool { return len(got.get()) == 1 })
	serveTLS(t, got.get()[0], c.IssuingRoots)
	// The two stale answers failed (and, rarely, an order whose nonces
	// were all rejected).
	if failed := testutil.ToFloat64(m.metrics.renewals.WithLabelValues("chaos.example.com", resultFailed)); failed < 2 {
		t.Fatalf("%v failed orders, want at least the 2 stale answers", failed)
	}
	if p, _, _, _ := c.http.counts(); p < 3 {
		t.Fatalf("%d presentations, want 3 or more", p)
	}
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  stdsync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// localCA issues 90-day certificates dated by the fake clock, and counts
// its orders per host.
type localCA struct {
	t     *testing.T
	clock *fakeClock
	mu    stdsync.Mutex
	calls map[string]int
}

func (l *localCA) Obtain(_ context.Context, host, _ string, _ Solver) (*providers.Bundle, error) {
	l.mu.Lock()
	l.calls[host]++
	l.mu.Unlock()
	now := l.clock.Now()
	return providertest.SelfSigned(l.t, host, now, now.Add(90*24*time.Hour)), nil
}

func (l *localCA) count(host string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[host]
}

type noSolver struct{}

func (noSolver) Type() string                                          { return ChallengeHTTP01 }
func (noSolver) Present(context.Context, string, string, string) error { return nil }
func (noSolver) CleanUp(context.Context, string, string, string) error { return nil }

// TestManagerDecidesWithItsClock: whether a certificate is due is the
// injected clock's call: not before its renewal time, at once when it is
// missing or expired, and a newer shared certificate is adopted.
func TestManagerDecidesWithItsClock(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := &fakeClock{now: t0}
	lca := &localCA{t: t, clock: clock, calls: map[string]int{}}
	var got issued
	reg := prometheus.NewRegistry()
	m := newManager(t, ManagerOptions{Issuer: lca, OnIssued: got.add, Registry: reg, Now: clock.Now})

	current := providertest.SelfSigned(t, "a.example.com", t0.Add(-24*time.Hour), t0.Add(89*24*time.Hour))
	expired := providertest.SelfSigned(t, "c.example.com", t0.Add(-90*24*time.Hour), t0.Add(-time.Hour))
	wants := []Want{
		{Host: "a.example.com", Current: current, Solver: noSolver{}},
		{Host: "b.example.com", Solver: noSolver{}},
		{Host: "c.example.com", Current: expired, Solver: noSolver{}},
	}
	m.Set(wants)
	waitFor(t, 10*time.Second, "b and c issued, a waiting", func() bool {
		st, _ := statusOf(m, "a.example.com")
		return len(got.forHost("b.example.com")) == 1 && len(got.forHost("c.example.com")) == 1 &&
			st.NextAttempt.Equal(current.RenewAt())
	})
	if n := lca.count("a.example.com"); n != 0 {
		t.Fatalf("a ordered %d times before its renewal time", n)
	}
	b := got.forHost("b.example.com")[0]
	for host, want := range map[string]*providers.Bundle{"a.example.com": current, "b.example.com": b, "c.example.com": got.forHost("c.example.com")[0]} {
		if st, _ := statusOf(m, host); st.Serial != want.Serial || !st.NotAfter.Equal(want.NotAfter) {
			t.Fatalf("status of %s: %+v, want %s", host, st, want)
		}
	}

	// Past a's renewal time: a is renewed, b (issued at t0, due at
	// t0+60d) is not.
	clock.Set(current.RenewAt().Add(time.Second))
	m.Set(wants)
	waitFor(t, 10*time.Second, "a renewed", func() bool { return len(got.forHost("a.example.com")) == 1 })
	if lca.count("b.example.com") != 1 || lca.count("c.example.com") != 1 {
		t.Fatalf("orders: %v", lca.calls)
	}
	renewed := got.forHost("a.example.com")[0]
	waitFor(t, 10*time.Second, "a's status", func() bool {
		st, _ := statusOf(m, "a.example.com")
		return st.Serial == renewed.Serial && st.NextAttempt.Equal(renewed.RenewAt())
	})

	// Another node's newer certificate is adopted; an older one is not.
	shared := providertest.SelfSigned(t, "a.example.com", clock.Now(), renewed.NotAfter.Add(time.Hour))
	older := providertest.SelfSigned(t, "b.example.com", t0.Add(-time.Hour), b.NotAfter.Add(-time.Hour))
	wants[0].Current, wants[1].Current = shared, older
	m.Set(wants)
	waitFor(t, 10*time.Second, "the shared certificate adopted", func() bool {
		a, _ := statusOf(m, "a.example.com")
		b2, _ := statusOf(m, "b.example.com")
		return a.Serial == shared.Serial && b2.Serial == b.Serial
	})

	// A host removed is gone from the status and the metrics.
	m.Set(wants[:1])
	if st := m.Status(); len(st) != 1 || st[0].Host != "a.example.com" {
		t.Fatalf("status after removing b and c: %+v", st)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP keel_certificate_renewals_total ACME orders for a host's certificate, by result (issued, failed).
# TYPE keel_certificate_renewals_total counter
keel_certificate_renewals_total{host="a.example.com",result="issued"} 1
`)); err != nil {
		t.Fatal(err)
	}
	m.Close()
	m.Set(wants) // after Close: ignored, no goroutine started
	if n := len(m.Status()); n != 1 {
		t.Fatalf("%d hosts after Set on a closed Manager", n)
	}
}

// blockingIssuer blocks every order until its context is done, and
// reports when one started.
type blockingIssuer struct{ started chan string }

func (b blockingIssuer) Obtain(ctx context.Context, host, _ string, _ Solver) (*providers.Bundle, error) {
	b.started <- host
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestRemovingAHostCancelsItsOrder: Set without a host cancels its
// running order; Close cancels the rest and waits for every goroutine.
func TestRemovingAHostCancelsItsOrder(t *testing.T) {
	bi := blockingIssuer{started: make(chan string, 4)}
	m := newManager(t, ManagerOptions{Issuer: bi, MaxConcurrent: 1})
	m.Set([]Want{{Host: "a.example.com", Solver: noSolver{}}, {Host: "b.example.com", Solver: noSolver{}}})
	first := <-bi.started
	other := map[string]string{"a.example.com": "b.example.com", "b.example.com": "a.example.com"}[first]
	m.Set([]Want{{Host: other, Solver: noSolver{}}})
	// The slot the removed host held goes to the other.
	select {
	case h := <-bi.started:
		if h != other {
			t.Fatalf("order started for %s, want %s", h, other)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the removed host's order kept the only slot")
	}
	done := make(chan struct{})
	go func() { m.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
}

func TestCAErrorsAreShort(t *testing.T) {
	h := func(k, v string) http.Header { return http.Header{k: {v}} }
	long := strings.Repeat("x", 1000)
	cases := []struct {
		name      string
		err       error
		typ       string
		retry     time.Duration
		wantInMsg string
	}{
		{"rate limited", &xacme.Error{StatusCode: 429, ProblemType: "urn:ietf:params:acme:error:rateLimited", Detail: "too many certificates", Header: h("Retry-After", "3600")},
			"rateLimited", time.Hour, "acme: new order: rateLimited: too many certificates (retry after 1h0m0s)"},
		{"server busy", &xacme.Error{StatusCode: 503, ProblemType: "", Detail: "", Header: h("Retry-After", "120")},
			"Service Unavailable", 2 * time.Minute, "Service Unavailable"},
		{"authorization", &xacme.AuthorizationError{URI: "https://ca.example/authz/secret-id", Identifier: "a.example", Errors: []error{
			&xacme.Error{StatusCode: 403, ProblemType: "urn:ietf:params:acme:error:dns", Detail: "no TXT record"}}},
			"dns", 0, "acme: new order: dns: no TXT record"},
		{"order", &xacme.OrderError{OrderURL: "https://ca.example/order/secret-id", Status: "invalid", Problem: &xacme.Error{
			StatusCode: 403, ProblemType: "urn:ietf:params:acme:error:unauthorized", Detail: long}},
			"unauthorized", 0, "…"},
		{"order, no problem", &xacme.OrderError{OrderURL: "https://ca.example/order/secret-id", Status: "invalid"}, "orderInvalid", 0, "orderInvalid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := caError("new order", tc.err)
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("%T, want *Error", err)
			}
			if ce.Type != tc.typ || ce.RetryAfter != tc.retry || !strings.Contains(err.Error(), tc.wantInMsg) {
				t.Fatalf("%+v: %q", ce, err)
			}
			if strings.Contains(err.Error(), "secret-id") || len(err.Error()) > maxDetail+100 {
				t.Fatalf("error too long or names a URL: %q", err)
			}
		})
	}
	other := errors.New("dial tcp: connection refused")
	if err := caError("new order", other); !errors.Is(err, other) {
		t.Fatalf("a network error is not wrapped: %v", err)
	}
}

func TestRetryBackoff(t *testing.T) {
	res := func(code int, retryAfter string) *http.Response {
		r := &http.Response{StatusCode: code, Header: http.Header{}}
		if retryAfter != "" {
			r.Header.Set("Retry-After", retryAfter)
		}
		return r
	}
	cases := []struct {
		name   string
		n      int
		res    *http.Response
		lo, hi time.Duration
	}{
		{"bad nonce: at once", 1, res(400, ""), 10 * time.Millisecond, 20 * time.Millisecond},
		{"bad nonce: gives up", maxNonceRetries + 1, res(400, ""), 0, 0},
		{"busy: short Retry-After honoured", 1, res(503, "5"), 5 * time.Second, 6 * time.Second},
		{"rate limited: long Retry-After left to the Manager", 1, res(429, "3600"), 0, 0},
		{"server error: backoff", 2, res(500, ""), 2 * time.Second, 3 * time.Second},
		{"server error: gives up", maxRetries + 1, res(500, ""), 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if d := retryBackoff(tc.n, nil, tc.res); d < tc.lo || d > tc.hi {
				t.Fatalf("retryBackoff = %s, want %s..%s", d, tc.lo, tc.hi)
			}
		})
	}
}
